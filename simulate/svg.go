package simulate

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
)

// SVG geometry, in pixels.
const (
	svgW, svgH                     = 900.0, 420.0
	padL, padR, padT, padB float64 = 64, 72, 40, 56
)

// WriteSVG draws arrivals and departures per second (left axis) and the
// bucket depth (right axis) over time, with ticked, labelled axes and a
// legend, as a standalone SVG. Elements carry ids (x-axis, y-axis,
// y2-axis, arrivals, departures, depth, legend) so tests can check the
// structure.
//
// It is long (about 110 lines): it writes the picture top to bottom (frame,
// axes and ticks, the three series, the legend), and the coordinates it
// computes once are shared by all of them.
func (r Result) WriteSVG(w io.Writer, title string) error {
	rows := r.Seconds()
	secs := float64(len(rows))
	// The left axis fits the departures and the arrivals but for spikes
	// (a burst arrives within one second): a second of more than twice the
	// most departures and the limit is drawn clipped at the top and labelled
	// with its count.
	maxRate, maxDepth := math.Max(1, r.Limit), 1.0
	for _, s := range rows {
		maxRate = math.Max(maxRate, float64(s.Departed))
	}
	clip := 2 * maxRate
	for _, s := range rows {
		if a := float64(s.Arrived); a <= clip {
			maxRate = math.Max(maxRate, a)
		}
	}
	for _, d := range r.Depth {
		maxDepth = math.Max(maxDepth, float64(d.Depth))
	}
	rateTop, rateStep := niceScale(maxRate*1.1, 5)
	depthTop, depthStep := niceScale(maxDepth*1.1, 5)
	timeTop, timeStep := niceScale(secs, 8)
	plotW, plotH := svgW-padL-padR, svgH-padT-padB
	x := func(sec float64) float64 { return padL + sec/timeTop*plotW }
	yRate := func(v float64) float64 { return padT + plotH - v/rateTop*plotH }
	yDepth := func(v float64) float64 { return padT + plotH - v/depthTop*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" viewBox="0 0 %g %g" font-family="sans-serif" font-size="12">`+"\n", svgW, svgH, svgW, svgH)
	fmt.Fprintf(&b, `<rect width="%g" height="%g" fill="white"/>`+"\n", svgW, svgH)
	fmt.Fprintf(&b, `<text x="%g" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(title))

	// Axes with ticks and labels.
	fmt.Fprintf(&b, `<g id="x-axis" stroke="black"><line x1="%g" y1="%g" x2="%g" y2="%g"/>`, padL, padT+plotH, padL+plotW, padT+plotH)
	for t := 0.0; t <= timeTop+1e-9; t += timeStep {
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%g" x2="%.1f" y2="%g"/><text x="%.1f" y="%g" text-anchor="middle" stroke="none">%g</text>`,
			x(t), padT+plotH, x(t), padT+plotH+5, x(t), padT+plotH+18, t)
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle" stroke="none">time (s)</text></g>`+"\n", padL+plotW/2, svgH-padB+38)
	fmt.Fprintf(&b, `<g id="y-axis" stroke="black"><line x1="%g" y1="%g" x2="%g" y2="%g"/>`, padL, padT, padL, padT+plotH)
	for v := 0.0; v <= rateTop+1e-9; v += rateStep {
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f"/><line x1="%g" y1="%.1f" x2="%g" y2="%.1f" stroke="#ddd"/><text x="%g" y="%.1f" text-anchor="end" stroke="none">%g</text>`,
			padL-5, yRate(v), padL, yRate(v), padL, yRate(v), padL+plotW, yRate(v), padL-8, yRate(v)+4, v)
	}
	fmt.Fprintf(&b, `<text transform="translate(16 %g) rotate(-90)" text-anchor="middle" stroke="none">messages per second</text></g>`+"\n", padT+plotH/2)
	fmt.Fprintf(&b, `<g id="y2-axis" stroke="black"><line x1="%g" y1="%g" x2="%g" y2="%g"/>`, padL+plotW, padT, padL+plotW, padT+plotH)
	for v := 0.0; v <= depthTop+1e-9; v += depthStep {
		fmt.Fprintf(&b, `<line x1="%g" y1="%.1f" x2="%g" y2="%.1f"/><text x="%g" y="%.1f" stroke="none">%g</text>`,
			padL+plotW, yDepth(v), padL+plotW+5, yDepth(v), padL+plotW+8, yDepth(v)+4, v)
	}
	fmt.Fprintf(&b, `<text transform="translate(%g %g) rotate(90)" text-anchor="middle" stroke="none">bucket depth (messages)</text></g>`+"\n", svgW-14, padT+plotH/2)

	// Series: per-second counts as steps, depth as steps.
	step := func(id, color, dash string, pts [][2]float64) {
		var p strings.Builder
		for i, pt := range pts {
			if i > 0 {
				fmt.Fprintf(&p, "%.1f,%.1f ", pt[0], pts[i-1][1])
			}
			fmt.Fprintf(&p, "%.1f,%.1f ", pt[0], pt[1])
		}
		fmt.Fprintf(&b, `<polyline id="%s" fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`+"\n", id, color, dash, strings.TrimSpace(p.String()))
	}
	var arr, dep, dp [][2]float64
	var spikes strings.Builder
	for _, s := range rows {
		t := float64(s.Second)
		a := math.Min(float64(s.Arrived), rateTop)
		if a < float64(s.Arrived) {
			fmt.Fprintf(&spikes, `<text x="%.1f" y="%g" fill="#1f77b4">%d arrived ↑</text>`, x(t)+4, padT+12, s.Arrived)
		}
		arr = append(arr, [2]float64{x(t), yRate(a)}, [2]float64{x(t + 1), yRate(a)})
		dep = append(dep, [2]float64{x(t), yRate(float64(s.Departed))}, [2]float64{x(t + 1), yRate(float64(s.Departed))})
	}
	// Depth: the last value in each pixel column (it changes at every
	// admission and departure).
	for _, d := range r.Depth {
		pt := [2]float64{math.Round(x(d.At.Seconds())), yDepth(float64(d.Depth))}
		if n := len(dp); n > 1 && dp[n-1][0] == pt[0] {
			dp[n-1] = pt
			continue
		}
		dp = append(dp, pt)
	}
	if len(dp) > 0 {
		dp = append(dp, [2]float64{x(secs), dp[len(dp)-1][1]})
	}
	const arrivalsColor, departuresColor, depthColor = "#1f77b4", "#2ca02c", "#d62728"
	step("arrivals", arrivalsColor, "", arr)
	step("departures", departuresColor, "", dep)
	step("depth", depthColor, ` stroke-dasharray="6 3"`, dp)
	b.WriteString(spikes.String() + "\n")

	// Legend.
	fmt.Fprintf(&b, `<g id="legend" transform="translate(%g %g)">`, padL+plotW-250, padT+8)
	fmt.Fprintf(&b, `<rect x="-8" y="-12" width="248" height="62" fill="white" stroke="#999"/>`)
	for i, e := range []struct{ color, dash, label string }{
		{arrivalsColor, "", "arrivals per second (left)"},
		{departuresColor, "", "departures per second (left)"},
		{depthColor, ` stroke-dasharray="6 3"`, "bucket depth (right)"},
	} {
		y := float64(i) * 18
		fmt.Fprintf(&b, `<line x1="0" y1="%g" x2="24" y2="%g" stroke="%s" stroke-width="2"%s/><text x="32" y="%g">%s</text>`, y, y, e.color, e.dash, y+4, e.label)
	}
	b.WriteString("</g>\n</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// niceScale returns an axis top ≥ v and a tick step (1, 2 or 5 × 10^k)
// giving about ticks ticks.
func niceScale(v float64, ticks int) (top, step float64) {
	if v <= 0 {
		return 1, 1
	}
	raw := v / float64(ticks)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if step = m * mag; step >= raw {
			break
		}
	}
	return math.Ceil(v/step) * step, step
}
