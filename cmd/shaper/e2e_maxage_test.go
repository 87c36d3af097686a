package main

import (
	"testing"
	"time"
)

// TestE2EMaxAgeWhilePaused: SPEC §3 Max age, through the binary on real
// NATS — a 429 with Retry-After: 10 pauses the lane; with bucket.max_age 3s
// the 19 messages waiting behind it are dead-lettered "expired" as they pass
// 3 s (the dead-letter stream holds them 5 s in, while the pause still
// holds), and the one that got the 429 comes back after 10 s, too old, and
// is dead-lettered as well: one downstream call in all, nothing lost.
func TestE2EMaxAgeWhilePaused(t *testing.T) {
	down := newScripted(t, func(key string, attempt int, since time.Duration) (int, string) {
		return 429, "10"
	})
	d := startDaemon(t, laneYAML(t, "{ capacity: 100, max_age: 3s }", "{ limit: 10/s }",
		"{ timeout: 5s, max_in_flight: 8 }", down.srv.URL))
	waitReady(t, d.AdminAddr(), 10*time.Second)
	js := connectJS(t, d.NATSURL())
	published := time.Now()
	keys := publishBurst(t, js, "e2e.sem.job", 20)
	time.Sleep(time.Until(published.Add(5 * time.Second)))
	early := deadLetters(t, js, 19, 500*time.Millisecond)
	if len(early) != 19 {
		t.Errorf("%d dead letters 5 s into a 10 s pause with max_age 3s, want 19 (dead-lettered as they pass max_age)", len(early))
	}
	all := deadLetters(t, js, 20, 15*time.Second)
	for _, k := range keys {
		if all[k] != "expired" {
			t.Errorf("%s: dead letter reason %q, want expired", k, all[k])
		}
	}
	if n := len(down.snapshot()); n != 1 {
		t.Errorf("%d downstream calls, want 1 (the one answered 429; the rest expired waiting)", n)
	}
	waitConsumerSettled(t, js, "E2E_SEM", "shaper-sem", 5*time.Second)
}
