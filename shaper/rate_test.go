package shaper

import (
	"errors"
	"math"
	"testing"
	"time"
)

func TestParseLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want float64
		bad  bool
	}{
		{"100/s", 100, false}, {"6000/m", 100, false}, {"3600/h", 1, false}, {"0.5/s", 0.5, false},
		{"200", 200, false}, {" 10 / s ", 10, false}, {"1e4/s", 10000, false},
		{"0/s", 0, true}, {"-1/s", 0, true}, {"0", 0, true}, {"10/fortnight", 0, true}, {"", 0, true},
		{"abc", 0, true}, {"NaN", 0, true}, {"Inf/s", 0, true}, {"1e400/s", 0, true}, {"/s", 0, true},
	} {
		got, err := ParseLimit(tc.in)
		if tc.bad {
			if err == nil || !errors.Is(err, ErrBadLimit) {
				t.Errorf("ParseLimit(%q) = %v, %v; want ErrBadLimit", tc.in, got, err)
			}
			continue
		}
		if err != nil || math.Abs(float64(got)-tc.want) > 1e-9 {
			t.Errorf("ParseLimit(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	if iv := Limit(100).Interval(); iv != 10*time.Millisecond {
		t.Errorf("interval of 100/s = %v", iv)
	}
}

func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/s", "1/h", "0.001/m", "-5", "1e308/s", "x/s", "5/"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := ParseLimit(s)
		if err != nil {
			return
		}
		if v := float64(l); !(v > 0) || math.IsInf(v, 0) || math.IsNaN(v) {
			t.Fatalf("ParseLimit(%q) = %v without error", s, v)
		}
	})
}
