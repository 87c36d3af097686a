package main

// The admin endpoint: readiness and /metrics.

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// httpGet returns the status and body of GET url.
func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	c.CloseIdleConnections()
	return resp.StatusCode, string(b), err
}

// waitReady polls http://addr/readyz until it answers 200, or fails.
func waitReady(t *testing.T, addr string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		code, body, err := httpGet("http://" + addr + "/readyz")
		if err == nil && code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz not 200 after %s: code %d, body %q, err %v", timeout, code, strings.TrimSpace(body), err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// sample is one line of the Prometheus text format.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// scrape reads http://addr/metrics and parses the samples (parseMetrics).
func scrape(t *testing.T, addr string) []sample {
	t.Helper()
	code, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil || code != http.StatusOK {
		t.Fatalf("GET /metrics: code %d, err %v", code, err)
	}
	out, err := parseMetrics(body)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// parseMetrics parses the Prometheus text format as client_golang writes
// it (no escapes in label values, no timestamps).
func parseMetrics(body string) ([]sample, error) {
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		s := sample{labels: map[string]string{}, value: v}
		head := line[:sp]
		if i := strings.IndexByte(head, '{'); i >= 0 {
			s.name = head[:i]
			for _, pair := range strings.Split(strings.TrimSuffix(head[i+1:], "}"), ",") {
				k, val, _ := strings.Cut(pair, "=")
				s.labels[k] = strings.Trim(val, `"`)
			}
		} else {
			s.name = head
		}
		out = append(out, s)
	}
	return out, nil
}

// metricValue returns the value of the series name{labels}, failing the
// test when it is missing.
func metricValue(t *testing.T, samples []sample, name string, labels map[string]string) float64 {
	t.Helper()
next:
	for _, s := range samples {
		if s.name != name || len(s.labels) != len(labels) {
			continue
		}
		for k, v := range labels {
			if s.labels[k] != v {
				continue next
			}
		}
		return s.value
	}
	t.Fatalf("metric %s%v not found", name, labels)
	return 0
}
