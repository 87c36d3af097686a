package simulate

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// ReadTrace reads an arrival trace: CSV lines `time_offset_seconds[,key]`
// (a first line that does not start with a number is a header and is
// skipped), or JSON lines `{"at": seconds, "key": "..."}` (when the first
// non-blank character is "{"). Offsets are seconds from the start, ≥ 0 and
// finite; blank lines are skipped. Errors name the line.
func ReadTrace(r io.Reader) ([]Arrival, error) {
	br := bufio.NewReader(r)
	head, _ := br.Peek(512)
	if t := bytes.TrimLeft(head, " \t\r\n"); len(t) > 0 && t[0] == '{' {
		return readJSONLines(br)
	}
	return readCSV(br)
}

func offset(s string) (time.Duration, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return 0, fmt.Errorf("time offset %q: want seconds ≥ 0", s)
	}
	return time.Duration(math.Round(f * 1e9)), nil
}

func readCSV(r io.Reader) ([]Arrival, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	var out []Arrival
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("trace: %w", err)
		}
		if len(rec) == 0 || (len(rec) == 1 && strings.TrimSpace(rec[0]) == "") {
			continue
		}
		at, err := offset(rec[0])
		if err != nil {
			if line == 1 {
				continue // a header
			}
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		a := Arrival{At: at}
		if len(rec) > 1 {
			a.Key = strings.TrimSpace(rec[1])
		}
		out = append(out, a)
	}
}

func readJSONLines(r io.Reader) ([]Arrival, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	var out []Arrival
	for line := 1; sc.Scan(); line++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var v struct {
			At  *float64 `json:"at"`
			Key string   `json:"key"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if v.At == nil {
			return nil, fmt.Errorf(`trace line %d: no "at"`, line)
		}
		at, err := offset(strconv.FormatFloat(*v.At, 'g', -1, 64))
		if err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		out = append(out, Arrival{At: at, Key: v.Key})
	}
	return out, sc.Err()
}

// Burst is a synthetic trace: n arrivals at once at offset 0 with key
// "burst", then, when trickle > 0, trickle per second evenly spaced for
// d with key "trickle".
func Burst(n int, trickle float64, d time.Duration) []Arrival {
	out := make([]Arrival, 0, n)
	for range n {
		out = append(out, Arrival{Key: "burst"})
	}
	if trickle > 0 {
		iv := time.Duration(float64(time.Second) / trickle)
		for t := iv; t <= d; t += iv {
			out = append(out, Arrival{At: t, Key: "trickle"})
		}
	}
	return out
}
