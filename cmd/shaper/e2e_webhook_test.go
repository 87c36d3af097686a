package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/internal/swverify"
	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/shaper/shapertest"
	"github.com/shaper-dev/shaper/sources"
)

// webhookReceiver is a stamped HTTP downstream that keeps every request:
// its arrival (kernel receive time), path and query, headers and body.
type webhookReceiver struct {
	mu   sync.Mutex
	got  []webhookCall
	base string
}

type webhookCall struct {
	at     time.Time
	target string // escaped path ? raw query
	req    swverify.Request
}

func newWebhookReceiver(t *testing.T) *webhookReceiver {
	t.Helper()
	w := &webhookReceiver{}
	srv := newStampedServer(t, func(rw http.ResponseWriter, r *http.Request, at time.Time) {
		body, _ := io.ReadAll(r.Body) // already read in full by newStampedServer
		w.mu.Lock()
		w.got = append(w.got, webhookCall{at: at, target: r.URL.EscapedPath() + "?" + r.URL.RawQuery,
			req: swverify.Request{Header: r.Header.Clone(), Body: body}})
		w.mu.Unlock()
		rw.WriteHeader(http.StatusNoContent)
	})
	w.base = srv.URL
	return w
}

func (w *webhookReceiver) calls() []webhookCall {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]webhookCall(nil), w.got...)
}

func (w *webhookReceiver) waitCalls(t *testing.T, n int, timeout time.Duration) []webhookCall {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c := w.calls()
		if len(c) >= n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("the receiver got %d requests in %s, want %d", len(c), timeout, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// webhookYAML is one lane "wh" at 30/s whose sink addresses each merchant
// by header and the region by subject token, signed with secrets.
func webhookYAML(storeDir, base, secrets string) string {
	return fmt.Sprintf(`
nats: { url: "", embedded: { listen: "127.0.0.1:0", store_dir: %q } }
admin: { listen: "127.0.0.1:0" }
shutdown: { drain_timeout: 5s }
downstreams:
  wh:
    source: { stream: E2E_WH, subjects: ["e2e.wh.>"], ack_wait: 60s, max_deliver: 5 }
    bucket: { capacity: 200 }
    rate: { limit: 30/s }
    task: { timeout: 2s, max_in_flight: 4 }
    sink:
      kind: http
      url: %q
      headers: { content-type: application/json }
      signing: { scheme: standard-webhooks, secrets: %s }
`, storeDir, base+"/merchants/{header:merchant}/events?region={subject:2}", secrets)
}

// TestE2EWebhookMerchantsSigned: SPEC §3 Per-message address and
// sink.signing through the daemon. Three merchants share one lane at 30/s:
// each merchant's jobs reach its own path (and the region from the
// subject), and all of them together hold SPEC G1 at the downstream
// (kernel receive timestamps, 1 s and 100 ms windows). A job without the
// merchant header is never sent: it is a dead letter "invalid" naming the
// header. Every request passes the reference Standard Webhooks verifier
// (npm standardwebhooks, by node) for the new secret; the old secret
// verifies the requests signed while both were configured and none after a
// reload removed it.
func TestE2EWebhookMerchantsSigned(t *testing.T) {
	const (
		limit    = 30.0
		perPhase = 40 // jobs per merchant before the rotation
		after    = 5  // jobs per merchant after it
	)
	merchants := []string{"m-1", "m/2", "m 3"} // escaped in the path: m-1, m%2F2, m%203
	oldSecret, newSecret := "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_C2FVsBQIhrscChlQIMV+b5sSYspob7oD"
	t.Setenv("E2E_WH_OLD", oldSecret)
	t.Setenv("E2E_WH_NEW", newSecret)

	recv := newWebhookReceiver(t)
	store := filepath.Join(t.TempDir(), "nats")
	d := startDaemon(t, webhookYAML(store, recv.base, `["${E2E_WH_NEW}", "${E2E_WH_OLD}"]`))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())

	publish := func(phase string, n int, withoutHeader bool) {
		t.Helper()
		var futures []jetstream.PubAckFuture
		for i := range n {
			for _, m := range merchants {
				msg := &nats.Msg{Subject: "e2e.wh.eu", Header: nats.Header{}, Data: fmt.Appendf(nil, `{"phase":%q,"merchant":%q,"seq":%d}`, phase, m, i)}
				msg.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("%s-%s-%03d", phase, m, i))
				msg.Header.Set("merchant", m)
				f, err := js.PublishMsgAsync(msg)
				if err != nil {
					t.Fatal(err)
				}
				futures = append(futures, f)
			}
			if withoutHeader && i == n/2 {
				msg := &nats.Msg{Subject: "e2e.wh.eu", Header: nats.Header{}, Data: []byte(`{"merchant":null}`)}
				msg.Header.Set(jetstream.MsgIDHeader, "no-merchant")
				f, err := js.PublishMsgAsync(msg)
				if err != nil {
					t.Fatal(err)
				}
				futures = append(futures, f)
			}
		}
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			case <-time.After(10 * time.Second):
				t.Fatal("publish acks timed out")
			}
		}
	}

	publish("rotating", perPhase, true)
	first := recv.waitCalls(t, perPhase*len(merchants), 30*time.Second)

	// The dead letter: reason invalid, naming the header; never sent.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var dls []sources.DeadLetter
	for {
		var err error
		dls, err = sources.DeadLetters{JS: js, Subject: "shaper.dead.wh"}.List(ctx, sources.DeadLetterFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(dls) > 0 || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(dls) != 1 || dls[0].Key != "no-merchant" || dls[0].Reason != shaper.ReasonInvalid ||
		!strings.Contains(dls[0].LastError, `"merchant"`) || dls[0].LastStatus != 0 {
		t.Errorf("dead letters %+v, want one: no-merchant, reason invalid, last error naming the header \"merchant\", no status", dls)
	}

	// Each merchant its own path; the sum at the rate (G1).
	byTarget := map[string]int{}
	var ts []time.Time
	for _, c := range first {
		byTarget[c.target]++
		ts = append(ts, c.at)
		if c.req.Header.Get("Webhook-Id") == "no-merchant" {
			t.Errorf("the job without the header was sent to %s", c.target)
		}
	}
	for _, want := range []string{"/merchants/m-1/events?region=eu", "/merchants/m%2F2/events?region=eu", "/merchants/m%203/events?region=eu"} {
		if byTarget[want] != perPhase {
			t.Errorf("%s got %d requests, want %d (all: %v)", want, byTarget[want], perPhase, byTarget)
		}
	}
	if len(byTarget) != len(merchants) {
		t.Errorf("requests went to %v, want the 3 merchants' paths only", byTarget)
	}
	span := ts[len(ts)-1].Sub(ts[0])
	t.Logf("%d requests to 3 merchants in %s: %.2f/s (limit %.0f/s)", len(ts), span.Round(time.Millisecond), float64(len(ts)-1)/span.Seconds(), limit)
	for _, w := range []time.Duration{time.Second, 100 * time.Millisecond} {
		n, _ := shapertest.MaxInWindow(ts, w)
		t.Logf("most in a %s window: %d (bound %d)", w, n, shapertest.BoundWhole(w, limit, 0))
		assertRate(t, "three merchants on one lane", ts, w, shapertest.BoundWhole(w, limit, 0))
	}

	// The rotation: a reload rebuilds the sink with the new secret only.
	cfg, _, err := config.Load(writeFile(t, "config.yaml", webhookYAML(store, recv.base, `["${E2E_WH_NEW}"]`)), nil)
	if err != nil {
		t.Fatal(err)
	}
	d.Reload(context.Background(), cfg)
	publish("rotated", after, false)
	all := recv.waitCalls(t, (perPhase+after)*len(merchants), 30*time.Second)

	reqs := make([]swverify.Request, len(all))
	for i, c := range all {
		reqs[i] = c.req
	}
	res := swverify.Verify(t, []string{newSecret, oldSecret}, reqs)
	for i, per := range res {
		rotated := strings.HasPrefix(all[i].req.Header.Get("Webhook-Id"), "rotated-")
		if (i >= len(first)) != rotated {
			t.Fatalf("request %d (%s) arrived out of its phase", i, all[i].req.Header.Get("Webhook-Id"))
		}
		if per[0] != "" {
			t.Errorf("request %d (%s): rejected with the new secret: %s", i, all[i].req.Header.Get("Webhook-Id"), per[0])
		}
		if !rotated && per[1] != "" {
			t.Errorf("request %d (%s): rejected with the old secret while both were configured: %s", i, all[i].req.Header.Get("Webhook-Id"), per[1])
		}
		if rotated && per[1] == "" {
			t.Errorf("request %d (%s): accepted with the old secret after it was removed", i, all[i].req.Header.Get("Webhook-Id"))
		}
	}
	if strings.Contains(d.logs.String(), strings.TrimPrefix(oldSecret, "whsec_")) || strings.Contains(d.logs.String(), strings.TrimPrefix(newSecret, "whsec_")) {
		t.Error("a signing secret appears in the daemon's logs")
	}
}
