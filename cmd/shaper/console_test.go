package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin"
)

// Issue 12: the web console of SPEC §6 at GET /, driven in a real browser
// (headless chromium through the DevTools protocol) against a real daemon
// whose admin API needs a token.

const consoleToken = "test-token"

// chromiumPath finds the browser on PATH. Under CI=true a missing browser
// fails the test (scripts/test.sh installs it); elsewhere the test skips.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "the console test needs chromium (or chromium-browser) on PATH; scripts/test.sh installs it"
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// consoleConfig is a daemon with the admin token set and two lanes: ops
// (20/s, capacity 100) to okURL and bad to badURL, whose 400s make dead
// letters (rejected_by_sink), with a daily quota (rate.quota).
func consoleConfig(store, okURL, badURL string) string {
	lane := func(name, limit string, capacity int, url string) string {
		return fmt.Sprintf(`
  %s:
    source: { stream: E2E_CONSOLE_%s, subjects: ["e2e.%s.>"], ack_wait: 60s, max_deliver: 5 }
    bucket: { capacity: %d, overflow: block }
    rate: { limit: %s }
    task: { timeout: 2s, max_in_flight: 4, retry: { backoff: [100ms] } }
    sink: { kind: http, url: %q, method: POST, success_status: [2xx] }`,
			name, strings.ToUpper(name), name, capacity, limit, url)
	}
	return fmt.Sprintf(`
nats:
  url: ""
  embedded: { listen: "127.0.0.1:0", store_dir: %q }
admin: { listen: "127.0.0.1:0", token: %q }
log: { level: info, format: text }
shutdown: { drain_timeout: 2s }
downstreams:%s%s
`, store, consoleToken, lane("ops", "20/s", 100, okURL), lane("bad", "50/s, quota: { count: 100000, per: 24h }", 100, badURL))
}

// apiLane reads GET /v1/lanes/{lane} with Go's HTTP client.
func apiLane(t *testing.T, addr, lane string) admin.LaneView {
	t.Helper()
	code, body, err := httpGet("http://" + addr + "/v1/lanes/" + lane)
	var v admin.LaneView
	if err != nil || code != http.StatusOK || json.Unmarshal([]byte(body), &v) != nil {
		t.Fatalf("GET /v1/lanes/%s: %d %q %v", lane, code, body, err)
	}
	return v
}

// artifactPath is where the test writes a file for people to look at:
// $SHAPER_ARTIFACTS_DIR, else cmd/shaper/testdata/artifacts (gitignored).
func artifactPath(t *testing.T, name string) string {
	t.Helper()
	dir := os.Getenv("SHAPER_ARTIFACTS_DIR")
	if dir == "" {
		dir = filepath.Join("testdata", "artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	p, err := filepath.Abs(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConsoleInBrowser: the console shows the lanes as the API does, asks
// for the token once on the first write (a 401), pauses and resumes a lane
// with it (judged through the API), lists a lane's dead letters by reason
// and replays them; the page throws no error. It saves a full-page
// screenshot as an artifact.
func TestConsoleInBrowser(t *testing.T) {
	browser := chromiumPath(t)
	start := time.Now()

	ok := newDownstream(t, nil)
	var badCalls atomic.Int64
	bad := newStampedServer(t, func(w http.ResponseWriter, _ *http.Request, _ time.Time) {
		badCalls.Add(1)
		http.Error(w, "no such account", http.StatusBadRequest)
	})
	d := startDaemon(t, consoleConfig(filepath.Join(t.TempDir(), "nats"), ok.url(), bad.URL+"/callback"))
	addr := d.AdminAddr()
	waitReady(t, addr, 15*time.Second)
	js := connectJS(t, d.NATSURL())
	// 400 at 20/s keep the ops bucket full (capacity 100) for 20 s.
	publishBurst(t, js, "e2e.ops.job", 400)
	publishBurst(t, js, "e2e.bad.job", 5)

	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.Headless,
		chromedp.WindowSize(1400, 1000), chromedp.UserDataDir(t.TempDir()))...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	// The browser lives as long as the context of its first Run: start it on
	// bctx, then bound every step by ctx.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", browser, err)
	}
	var mu sync.Mutex
	var pageErrors []string
	if err := chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch ev := ev.(type) {
		case *runtime.EventExceptionThrown:
			pageErrors = append(pageErrors, fmt.Sprintf("exception: %s %v", ev.ExceptionDetails.Text, ev.ExceptionDetails.Exception))
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.ConsoleAPICalledTypeError {
				pageErrors = append(pageErrors, "console.error")
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bctx, 60*time.Second)
	defer cancel()

	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("text of %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}
	// until waits for a JavaScript predicate on the page.
	until := func(what, predicate string) {
		t.Helper()
		if _, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](predicate,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(15*time.Second))); err != nil {
			t.Fatalf("waiting for %s (%s): %v", what, predicate, err)
		}
	}
	field := func(lane, f string) string {
		return fmt.Sprintf(`tr[data-lane=%q] [data-field=%q]`, lane, f)
	}
	stateIs := func(lane, state string) string {
		return fmt.Sprintf(`document.querySelector(%q).textContent.startsWith(%q)`, field(lane, "state"), state)
	}

	// The lanes as the API shows them.
	do("open the console", chromedp.Navigate("http://"+addr+"/"), chromedp.WaitVisible(chromedp.CSS(field("ops", "limit"))))
	until("two polls", `Number(document.body.dataset.polls) >= 2`)
	if got := text(field("ops", "lane")); got != "ops" {
		t.Errorf("lane cell %q, want ops", got)
	}
	uiDepth, uiLimit := text(field("ops", "depth")), text(field("ops", "limit"))
	v := apiLane(t, addr, "ops")
	if uiLimit != strconv.FormatFloat(v.Limit, 'f', -1, 64) || v.Limit != 20 {
		t.Errorf("limit: console %q, API %v, want 20", uiLimit, v.Limit)
	}
	if n, err := strconv.Atoi(uiDepth); err != nil || n < 1 || n > v.Capacity {
		t.Errorf("depth: console %q, capacity %d (under a backlog of 400 at 20/s)", uiDepth, v.Capacity)
	}
	if got := text(field("bad", "state")); !strings.Contains(got, "quota left") {
		t.Errorf("state cell of the lane with a quota %q, want what remains of it", got)
	}
	if got := text(field("ops", "state")); strings.Contains(got, "quota") {
		t.Errorf("state cell of a lane without a quota %q, want no quota", got)
	}
	if got := text(field("ops", "capacity")); got != "100" {
		t.Errorf("capacity cell %q, want 100", got)
	}

	// Pause: the first write is answered 401, the console asks for the
	// token, sends it and keeps it for the tab.
	reason := `tr[data-pause-form-for="ops"] input[name="reason"]`
	do("pause", chromedp.Click(chromedp.CSS(`tr[data-lane="ops"] button[data-action="pause"]`)),
		chromedp.SendKeys(chromedp.CSS(reason), "console test"))
	// An operator types while the console polls: the form keeps the focus
	// (a poll that moved every row blurred it once a second).
	polls, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.dataset.polls`))
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(polls)
	until("two polls with the pause form open", fmt.Sprintf(`Number(document.body.dataset.polls) >= %d`, n+2))
	if focused, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.activeElement === document.querySelector(%q)`, reason))); err != nil || !focused {
		t.Errorf("the pause form's reason field lost the focus while the console polled (%v)", err)
	}
	do("confirm the pause", chromedp.Click(chromedp.CSS(`tr[data-pause-form-for="ops"] button[data-action="pause-confirm"]`)))
	do("enter the token", chromedp.WaitVisible(chromedp.ID("token-input")),
		chromedp.SendKeys(chromedp.ID("token-input"), consoleToken),
		chromedp.Click(chromedp.ID("token-submit")))
	until("ops paused in the console", stateIs("ops", "paused"))
	// Paused, the lane departs nothing, and its bucket refills only once a
	// quarter of it is free (the low-water mark), so its depth stands
	// still: the console must show the API's depth exactly. (Under the
	// backlog, two reads a poll apart differ by up to that quarter.)
	depth := apiLane(t, addr, "ops").Depth
	for settle := time.Now().Add(5 * time.Second); time.Now().Before(settle); {
		time.Sleep(200 * time.Millisecond)
		d := apiLane(t, addr, "ops").Depth
		if d == depth {
			break
		}
		depth = d
	}
	until("the console shows the paused lane's depth", fmt.Sprintf(`document.querySelector(%q).textContent === %q`,
		field("ops", "depth"), strconv.Itoa(depth)))
	if v := apiLane(t, addr, "ops"); v.State != "paused" || v.PauseReason != "console test" || v.PausedUntil != nil {
		t.Errorf("after the console's pause the API shows %s (reason %q, until %v), want paused until resumed, reason \"console test\"",
			v.State, v.PauseReason, v.PausedUntil)
	}

	// Resume: with the token kept, no second question.
	do("resume", chromedp.Click(chromedp.CSS(`tr[data-lane="ops"] button[data-action="resume"]`)))
	until("ops running in the console", stateIs("ops", "running"))
	if v := apiLane(t, addr, "ops"); v.State != "running" {
		t.Errorf("after the console's resume the API shows %s, want running", v.State)
	}
	if asked, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.getElementById('token-dialog').open`)); err != nil || asked {
		t.Errorf("the console asked for the token again on resume (open %v, %v)", asked, err)
	}
	if shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](
		fmt.Sprintf(`document.body.innerText.includes(%q) || document.getElementById('token-input').value !== ''`, consoleToken))); err != nil || shown {
		t.Errorf("the token is on the page (%v, %v)", shown, err)
	}

	// Dead letters of bad: listed, filtered by reason, replayed.
	until("bad's 5 dead letters in the console", fmt.Sprintf(`Number(document.querySelector(%q).textContent) >= 5`, field("bad", "dead_letters")))
	do("dead letters of bad", chromedp.Click(chromedp.CSS(`tr[data-lane="bad"] button[data-action="dead-letters"]`)))
	until("5 dead letters listed", `document.querySelectorAll('#dl-table tbody tr').length === 5`)
	if got := text(`#dl-table tbody tr td:nth-child(4)`); got != "rejected_by_sink" {
		t.Errorf("dead letter reason %q, want rejected_by_sink", got)
	}
	do("filter by max_wait", chromedp.SetValue(chromedp.ID("dl-reason"), "max_wait"),
		chromedp.Click(chromedp.CSS(`#dl-filter button[type="submit"]`)))
	until("no max_wait dead letters", `document.getElementById('dl-message').textContent === 'No dead letters match.'`)
	calls := badCalls.Load()
	do("replay rejected_by_sink", chromedp.SetValue(chromedp.ID("dl-reason"), "rejected_by_sink"),
		chromedp.Click(chromedp.CSS(`#dl-filter button[type="submit"]`)),
		chromedp.Click(chromedp.ID("dl-replay")), chromedp.Click(chromedp.ID("dl-replay-confirm")))
	until("the replay's answer", `document.getElementById('dl-message').textContent.startsWith('Replayed 5 through bad.')`)
	deadline := time.Now().Add(10 * time.Second)
	for badCalls.Load() < calls+5 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := badCalls.Load() - calls; n < 5 {
		t.Errorf("%d calls to bad's downstream after the replay of 5 dead letters, want 5", n)
	}

	// The charts after a few seconds of history, then the artifact.
	until("10 samples in the charts", `Number(document.getElementById('chart-depth').dataset.samples) >= 10`)
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	path := artifactPath(t, "console.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes); the test took %s", path, len(png), time.Since(start).Round(time.Millisecond))

	mu.Lock()
	for _, e := range pageErrors {
		t.Errorf("the page reported an error: %s", e)
	}
	mu.Unlock()

	// Close the browser, then stop the daemon without departing the rest of
	// the backlog at 20/s (the cleanup's drain would take seconds).
	cancelBrowser()
	cancelAlloc()
	d.stop(500 * time.Millisecond)
}
