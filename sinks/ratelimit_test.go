package sinks_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shaper-dev/shaper/shaper"
	"github.com/shaper-dev/shaper/sinks"
)

func TestParseRateLimit(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	type info = shaper.RateLimitInfo
	none := info{Limit: -1, Remaining: -1}
	tests := []struct {
		name   string
		h      map[string]string
		want   info
		wantOK bool
	}{
		{"none", nil, none, false},
		{"IETF draft", map[string]string{"RateLimit-Limit": "100", "RateLimit-Remaining": "0", "RateLimit-Reset": "3"},
			info{Limit: 100, Remaining: 0, Reset: 3 * time.Second}, true},
		{"IETF draft with window", map[string]string{"RateLimit-Limit": "100, 100;w=60, 1000;w=3600"},
			info{Limit: 100, Remaining: -1, Window: time.Minute}, true},
		{"policy header", map[string]string{"RateLimit-Policy": `"default";q=3000;w=60`, "RateLimit": `"default";r=50;t=30`},
			info{Limit: 3000, Remaining: 50, Reset: 30 * time.Second, Window: time.Minute}, true},
		{"draft 3 combined", map[string]string{"RateLimit": "limit=100, remaining=7, reset=2"},
			info{Limit: 100, Remaining: 7, Reset: 2 * time.Second}, true},
		{"X- delta seconds", map[string]string{"X-RateLimit-Limit": "60", "X-RateLimit-Remaining": "12", "X-RateLimit-Reset": "5"},
			info{Limit: 60, Remaining: 12, Reset: 5 * time.Second}, true},
		{"X- fractional seconds", map[string]string{"X-RateLimit-Reset": "1.5"},
			info{Limit: -1, Remaining: -1, Reset: 1500 * time.Millisecond}, true},
		{"X- epoch seconds", map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1800000004"},
			info{Limit: -1, Remaining: 0, Reset: 4 * time.Second}, true},
		{"X- epoch in the past", map[string]string{"X-RateLimit-Reset": "1799999990"},
			info{Limit: -1, Remaining: -1}, true},
		{"IETF wins over X-", map[string]string{"RateLimit-Remaining": "3", "X-RateLimit-Remaining": "9", "RateLimit-Reset": "1", "X-RateLimit-Reset": "8"},
			info{Limit: -1, Remaining: 3, Reset: time.Second}, true},
		{"malformed ignored", map[string]string{"RateLimit-Limit": "lots", "RateLimit-Remaining": "-1", "RateLimit-Reset": "1e3", "X-RateLimit-Reset": "NaN"},
			none, false},
		{"huge reset ignored", map[string]string{"RateLimit-Reset": "99999999999999999999", "X-RateLimit-Reset": "1e300"},
			none, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.h {
				h.Set(k, v)
			}
			got, ok := sinks.ParseRateLimit(h, now)
			if got != tc.want || ok != tc.wantOK {
				t.Errorf("ParseRateLimit(%v) = %+v, %v; want %+v, %v", tc.h, got, ok, tc.want, tc.wantOK)
			}
		})
	}
}

func FuzzParseRateLimit(f *testing.F) {
	f.Add("100;w=60", "0", "3", `"default";r=5;t=2`)
	f.Add("", "", "1800000004", "limit=1, remaining=2, reset=3")
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, limit, remaining, reset, combined string) {
		h := http.Header{}
		h.Set("RateLimit-Limit", limit)
		h.Set("X-RateLimit-Remaining", remaining)
		h.Set("X-RateLimit-Reset", reset)
		h.Set("RateLimit", combined)
		got, _ := sinks.ParseRateLimit(h, now)
		if got.Reset < 0 || got.Window < 0 || got.Limit < -1 || got.Remaining < -1 {
			t.Fatalf("ParseRateLimit = %+v: negative", got)
		}
	})
}

// TestHTTPReportsRateLimitHeaders: the HTTP sink reports the rate-limit
// headers of successes and of failures to the function of
// shaper.WithRateLimitReport, and nothing when there are none.
func TestHTTPReportsRateLimitHeaders(t *testing.T) {
	var status int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if status != 204 {
			w.Header().Set("RateLimit-Remaining", "0")
			w.Header().Set("RateLimit-Reset", "3")
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	s, err := sinks.NewHTTP(sinks.HTTPConfig{URL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, st := range []int{200, 429, 204} {
		status = st
		var got []shaper.RateLimitInfo
		ctx := shaper.WithRateLimitReport(context.Background(), func(i shaper.RateLimitInfo) { got = append(got, i) })
		_ = s.Send(ctx, &shaper.Message{Stream: "S", StreamSeq: 1, Data: []byte("x")})
		want := 1
		if st == 204 {
			want = 0
		}
		if len(got) != want || (want == 1 && (got[0].Remaining != 0 || got[0].Reset != 3*time.Second)) {
			t.Errorf("status %d: reports %+v, want %d with remaining 0, reset 3s", st, got, want)
		}
	}
}
