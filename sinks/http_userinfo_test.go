package sinks_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/shaper-dev/shaper/sinks"
)

// TestHTTPURLUserInfo: the URL's user info is sent as HTTP basic auth, as
// http.Client sends it, also now that the sink's own transport is used without
// a Client (HTTP.send, issue 15); an Authorization header of sink.headers
// wins over it, and it never appears in the request line.
func TestHTTPURLUserInfo(t *testing.T) {
	type seen struct {
		user, password string
		ok             bool
		authorization  string
		uri            string
	}
	got := make(chan seen, 1)
	srv := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, password, ok := r.BasicAuth()
		got <- seen{user, password, ok, r.Header.Get("Authorization"), r.RequestURI}
	}))
	userURL := strings.Replace(srv.URL, "http://", "http://user:hunter%3A2@", 1) + "/hook?x=1"
	for _, tc := range []struct {
		name      string
		cfg       sinks.HTTPConfig
		wantBasic bool
		wantAuth  string
	}{
		{"user info", sinks.HTTPConfig{URL: userURL}, true, ""},
		{"user info and a template", sinks.HTTPConfig{URL: strings.Replace(userURL, "/hook", "/{subject:0}", 1)}, true, ""},
		{"configured Authorization wins", sinks.HTTPConfig{URL: userURL, Headers: map[string]string{"Authorization": "Bearer t0ken"}}, false, "Bearer t0ken"},
		{"no user info", sinks.HTTPConfig{URL: srv.URL + "/hook"}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newHTTP(t, tc.cfg)
			if err := send(t, s, testMessage()); err != nil {
				t.Fatal(err)
			}
			r := <-got
			switch {
			case tc.wantBasic && (!r.ok || r.user != "user" || r.password != "hunter:2"):
				t.Errorf("basic auth %q:%q (ok %v), want user:hunter:2 from the URL", r.user, r.password, r.ok)
			case !tc.wantBasic && r.authorization != tc.wantAuth:
				t.Errorf("Authorization %q, want %q", r.authorization, tc.wantAuth)
			}
			if strings.Contains(r.uri, "hunter") || strings.Contains(r.uri, "user") {
				t.Errorf("request line %q carries the user info", r.uri)
			}
		})
	}
}
