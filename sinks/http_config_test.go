package sinks

import "testing"

// TestCheckHTTPStatusPatterns: success_status takes a code 100-599 or a
// class 1xx-5xx (x in either case), nothing else; config reports these
// problems through CheckHTTP.
func TestCheckHTTPStatusPatterns(t *testing.T) {
	for s, ok := range map[string]bool{
		"2xx": true, "2XX": true, "5xx": true, "200": true, "204": true, "599": true, "100": true,
		"6xx": false, "600": false, "099": false, "20": false, "2000": false, "x00": false, "": false, "2x0": false,
	} {
		ps := CheckHTTP(HTTPConfig{URL: "http://x/", SuccessStatus: []string{s}})
		if got := len(ps) == 0; got != ok {
			t.Errorf("success_status %q: problems %v, want valid %v", s, ps, ok)
		}
	}
}
