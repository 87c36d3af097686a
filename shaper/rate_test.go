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

// TestFormatRate: rates for people (shaper lanes, validate's messages):
// never in exponent form, at most four significant digits or to the unit
// in FormatRate, exact in Limit.String (found by a new-user pass:
// 3.3519162934999995/5/s and 2e+06/s).
func TestFormatRate(t *testing.T) {
	for in, want := range map[float64]string{
		3.3519162934999995: "3.352", 2.5001015155: "2.5", 5: "5", 2e6: "2000000", 1000.4: "1000",
		0.5: "0.5", 1.0 / 86400: "0.00001157", 0: "0", 99.99999: "100",
	} {
		if got := FormatRate(in); got != want {
			t.Errorf("FormatRate(%v) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[Limit]string{2e6: "2000000/s", 0.5: "0.5/s", 100: "100/s"} {
		if got := in.String(); got != want {
			t.Errorf("Limit(%v).String() = %q, want %q", float64(in), got, want)
		}
	}
}
