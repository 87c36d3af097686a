package sinks_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

// TestParseURLTemplateRejects: SPEC §3 Per-message address — placeholders
// only in the path and query; the scheme, user info, host and port never
// come from a message. Each error names what is wrong without quoting the
// URL (which may carry credentials).
func TestParseURLTemplateRejects(t *testing.T) {
	for _, tc := range []struct{ url, want string }{
		{"http://{header:host}/cb", "in the scheme, host or port"},
		{"http://psp.example:{header:port}/cb", "in the scheme, host or port"},
		{"http://psp-{subject:1}.example/cb", "in the scheme, host or port"},
		{"{header:scheme}://psp.example/cb", "in the scheme, host or port"},
		{"http://user:{header:pw}@psp.example/cb", "in the scheme, host or port"},
		{"https://psp.example/cb#{header:f}", "in the fragment"},
		{"https://psp.example/{merchant}/cb", "unknown placeholder {merchant}"},
		{"https://psp.example/{query:x}/cb", "unknown placeholder {query:x}"},
		{"https://psp.example/{header:bad name}/cb", "not a valid header name"},
		{"https://psp.example/{header:}/cb", "not a valid header name"},
		{"https://psp.example/{subject:-1}/cb", "subject token number"},
		{"https://psp.example/{subject:x}/cb", "subject token number"},
		{"https://psp.example/{header:merchant/cb", `a "{" without its "}"`},
		{"https://psp.example/merchant}/cb", `a "}" without its "{"`},
		{"ftp://psp.example/{header:m}", "absolute http or https URL"},
		{"psp.example/{header:m}", "absolute http or https URL"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			_, err := sinks.ParseURLTemplate(tc.url)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("ParseURLTemplate(%q) = %v, want an error with %q", tc.url, err, tc.want)
			}
			if strings.Contains(err.Error(), "psp") {
				t.Errorf("the error quotes the URL: %v", err)
			}
		})
	}
}

// TestURLTemplateExpand: values are filled from the message and escaped
// for where they stand — path-escaped in the path (one segment, "/" is
// %2F), query-escaped in the query (no added parameters); a missing header,
// a subject with too few tokens or a path value that climbs is
// shaper.ErrInvalidMessage, naming the placeholder.
func TestURLTemplateExpand(t *testing.T) {
	msg := func(subject string, h map[string][]string) *shaper.Message {
		return &shaper.Message{Subject: subject, Header: h, Stream: "S", StreamSeq: 1}
	}
	for _, tc := range []struct {
		name, tmpl string
		m          *shaper.Message
		want       string // "" = an invalid message
		wantErr    string
	}{
		{"no placeholders: as written", "https://u:p@psp.example:8443/cb?t=1#x", msg("a.b", nil), "https://u:p@psp.example:8443/cb?t=1#x", ""},
		{"header in the path", "http://h/m/{header:merchant}/cb", msg("a", map[string][]string{"merchant": {"m1", "m2"}}), "http://h/m/m1/cb", ""},
		{"header name in any case", "http://h/m/{header:Merchant-Id}", msg("a", map[string][]string{"merchant-id": {"m7"}}), "http://h/m/m7", ""},
		{"subject token from 0 (SPEC example)", "http://h/m/{subject:2}", msg("bb.x.m1", nil), "http://h/m/m1", ""},
		{"path-escaped: one segment", "http://h/m/{header:m}/cb", msg("a", map[string][]string{"m": {"a/b c?d#e%"}}), "http://h/m/a%2Fb%20c%3Fd%23e%25/cb", ""},
		{"query-escaped: one value", "http://h/cb?m={header:m}&x=1", msg("a", map[string][]string{"m": {"a&b=c d#/"}}), "http://h/cb?m=a%26b%3Dc+d%23%2F&x=1", ""},
		{"path and query", "http://h/{subject:0}/cb?s={subject:1}", msg("pay.eu", nil), "http://h/pay/cb?s=eu", ""},
		{"literal escapes kept", "http://h/%7Bx%7D/{header:m}", msg("a", map[string][]string{"m": {"v"}}), "http://h/%7Bx%7D/v", ""},
		{"missing header", "http://h/m/{header:merchant}/cb", msg("a", map[string][]string{"other": {"x"}}), "", `no header "merchant"`},
		{"empty header", "http://h/m/{header:merchant}/cb", msg("a", map[string][]string{"merchant": {""}}), "", `no header "merchant"`},
		{"subject too short", "http://h/m/{subject:3}", msg("bb.x.m1", nil), "", "the subject has 3 tokens, no token 3"},
		{"dot-dot in the path", "http://h/m/{header:m}/cb", msg("a", map[string][]string{"m": {".."}}), "", "climb the path"},
		{"dot-dot in the query is a value", "http://h/cb?m={header:m}", msg("a", map[string][]string{"m": {".."}}), "http://h/cb?m=..", ""},
	} {
		for _, packed := range []bool{false, true} { // packed: as the lane leaves them (drain.PackedHeaderReader)
			t.Run(fmt.Sprintf("%s/packed=%v", tc.name, packed), func(t *testing.T) {
				tmpl, err := sinks.ParseURLTemplate(tc.tmpl)
				if err != nil {
					t.Fatal(err)
				}
				m := *tc.m
				if packed {
					m.PackHeader(tc.m.Header)
				}
				got, err := tmpl.Expand(&m)
				if tc.want == "" {
					if !errors.Is(err, shaper.ErrInvalidMessage) || !strings.Contains(err.Error(), tc.wantErr) {
						t.Fatalf("Expand = %q, %v; want ErrInvalidMessage with %q", got, err, tc.wantErr)
					}
					return
				}
				if err != nil || got != tc.want {
					t.Fatalf("Expand = %q, %v; want %q", got, err, tc.want)
				}
			})
		}
	}
}

// TestHTTPPerMessageAddress: one HTTP sink (one lane) reaches an endpoint
// per message on a real loopback server; a message without the header is a
// permanent SinkError wrapping shaper.ErrInvalidMessage (dead letter
// "invalid") that names the header and sends nothing.
func TestHTTPPerMessageAddress(t *testing.T) {
	var (
		mu   sync.Mutex
		seen []string
	)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.EscapedPath()+"?"+r.URL.RawQuery)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	s := newHTTP(t, sinks.HTTPConfig{URL: srv.URL + "/merchants/{header:merchant}/cb?region={subject:2}&k=v"})
	for _, merchant := range []string{"m1", "m 2", "m/3"} {
		m := testMessage()
		m.Header["merchant"] = []string{merchant}
		if err := send(t, s, m); err != nil {
			t.Fatalf("merchant %q: %v", merchant, err)
		}
	}
	want := []string{"/merchants/m1/cb?region=eu&k=v", "/merchants/m%202/cb?region=eu&k=v", "/merchants/m%2F3/cb?region=eu&k=v"}
	mu.Lock()
	got := append([]string(nil), seen...)
	mu.Unlock()
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("the downstream saw %q, want %q", got, want)
	}

	err := send(t, s, testMessage()) // no merchant header
	var se *shaper.SinkError
	if !errors.As(err, &se) || !se.Permanent || !errors.Is(err, shaper.ErrInvalidMessage) || !errors.Is(err, shaper.ErrPermanent) {
		t.Fatalf("Send without the header = %v, want a permanent SinkError wrapping ErrInvalidMessage", err)
	}
	if !strings.Contains(err.Error(), `"merchant"`) || strings.Contains(err.Error(), srv.URL) {
		t.Errorf("error %q: want it to name the header and not the URL", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 3 {
		t.Errorf("%d requests reached the downstream, want 3: the invalid message must send nothing", len(seen))
	}
}

// TestNewHTTPRejectsHostPlaceholder: NewHTTP checks the template too, under
// its key "url".
func TestNewHTTPRejectsHostPlaceholder(t *testing.T) {
	_, err := sinks.NewHTTP(sinks.HTTPConfig{URL: "http://{header:h}:8080/cb"})
	if err == nil || !strings.Contains(err.Error(), "url: placeholder {header:h} in the scheme, host or port") {
		t.Fatalf("NewHTTP = %v, want a url error naming the placeholder", err)
	}
}

// FuzzURLTemplateExpand: whatever a message holds, the expanded URL keeps
// the template's scheme, user info, host and port, its number of path
// segments and its query parameters (a value never adds any).
func FuzzURLTemplateExpand(f *testing.F) {
	for _, seed := range []string{"m1", "a/b", "../x", "?q=1#f", "%2F%00", "a&b=c", "@evil.example", "x y", "é/ü"} {
		f.Add(seed, "s.t.u")
	}
	const tmpl = "https://user:pw@psp.example:8443/a/{header:m}/b/{subject:1}?m={header:m}&s={subject:1}&k=v"
	tp, err := sinks.ParseURLTemplate(tmpl)
	if err != nil {
		f.Fatal(err)
	}
	base, _ := url.Parse(tmpl)
	f.Fuzz(func(t *testing.T, value, subject string) {
		m := &shaper.Message{Subject: subject, Header: map[string][]string{"m": {value}}}
		got, err := tp.Expand(m)
		if err != nil {
			if !errors.Is(err, shaper.ErrInvalidMessage) {
				t.Fatalf("Expand error %v is not ErrInvalidMessage", err)
			}
			return
		}
		u, err := url.Parse(got)
		if err != nil {
			t.Fatalf("Expand = %q does not parse: %v", got, err)
		}
		if u.Scheme != base.Scheme || u.Host != base.Host || u.User.String() != base.User.String() {
			t.Fatalf("Expand = %q moved the request: scheme %q host %q user %q", got, u.Scheme, u.Host, u.User)
		}
		if n := strings.Count(u.EscapedPath(), "/"); n != 4 {
			t.Fatalf("Expand = %q has %d path separators, want 4", got, n)
		}
		q := u.Query()
		if len(q) != 3 || q.Get("m") != value || q.Get("k") != "v" {
			t.Fatalf("Expand = %q: query %v, want m=%q, s, k=v only", got, q, value)
		}
	})
}
