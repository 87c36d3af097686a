package admin

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// get serves GET path on the admin mux and returns the response and body.
func consoleGet(t *testing.T, h http.Handler, method, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
	resp := rec.Result()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// TestConsoleSelfContained: GET / is the console's HTML; it and every asset
// it refers to are served from this origin with their content types, and
// none of them names an external host; the script never parses API values
// as HTML.
func TestConsoleSelfContained(t *testing.T) {
	h := NewHandler(prometheus.NewRegistry(), nil, "token", slog.New(slog.DiscardHandler))
	resp, page := consoleGet(t, h, http.MethodGet, "/")
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("GET /: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if !strings.Contains(page, "<title>shaper console</title>") {
		t.Errorf("GET / is not the console:\n%s", page)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "http") {
		t.Errorf("Content-Security-Policy %q: want default-src 'none' and only 'self'", csp)
	}

	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}`)
	bodies := map[string]string{"/": page}
	wantType := map[string]string{".css": "text/css; charset=utf-8", ".js": "text/javascript; charset=utf-8"}
	refs := regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(page, -1)
	if len(refs) < 2 {
		t.Fatalf("index.html refers to %d assets, want the CSS and the script", len(refs))
	}
	for _, m := range refs {
		ref := m[1]
		if strings.Contains(ref, ":") || strings.HasPrefix(ref, "/") {
			t.Errorf("asset %q: want a path relative to this origin", ref)
			continue
		}
		resp, body := consoleGet(t, h, http.MethodGet, "/"+ref)
		ext := ref[strings.LastIndexByte(ref, '.'):]
		if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != wantType[ext] {
			t.Errorf("GET /%s: %d %q, want 200 %q", ref, resp.StatusCode, resp.Header.Get("Content-Type"), wantType[ext])
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET /%s: no X-Content-Type-Options: nosniff", ref)
		}
		bodies["/"+ref] = body
	}
	for path, body := range bodies {
		if strings.Contains(body, "http://") || strings.Contains(body, "https://") {
			t.Errorf("%s refers to http:// or https://", path)
		}
		if m := external.FindString(body); m != "" {
			t.Errorf("%s refers to an external host: %q", path, m)
		}
	}
	js := bodies["/console/console.js"]
	if js == "" {
		t.Fatal("index.html does not load console/console.js")
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("} {
		if strings.Contains(js, sink) {
			t.Errorf("console.js uses %s: API values must go through textContent", sink)
		}
	}
	if !strings.Contains(js, "sessionStorage") || !strings.Contains(js, "'Bearer '") {
		t.Error("console.js does not keep the token in sessionStorage and send it as Bearer")
	}

	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{http.MethodHead, "/", http.StatusOK},
		{http.MethodGet, "/console/", http.StatusNotFound},
		{http.MethodGet, "/console/index.html", http.StatusNotFound},
		{http.MethodGet, "/console/missing.js", http.StatusNotFound},
		{http.MethodGet, "/console/sub/console.js", http.StatusNotFound},
		{http.MethodGet, "/index.html", http.StatusNotFound},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
	} {
		if resp, _ := consoleGet(t, h, tc.method, tc.path); resp.StatusCode != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, resp.StatusCode, tc.code)
		}
	}
}
