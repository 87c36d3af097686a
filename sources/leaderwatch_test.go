package sources

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestLeaderWatchVoids pins when a leader-elected advisory voids the open
// pull (leaderWatch): only a pull sent leaderGrace or more before the
// advisory, that received nothing after it, with no 409 within 1 s before
// it. A pull that the new leader serves must not be voided: what it sends
// after the unsubscribe waits out the ack wait.
func TestLeaderWatchVoids(t *testing.T) {
	now := time.Now()
	cases := []struct {
		name    string
		started time.Duration // before the advisory
		lastMsg time.Duration // before the advisory (negative: after; 0: none)
		last409 time.Duration // before the advisory (0: none)
		want    bool
	}{
		{"sent to the old leader, no answer", 300 * time.Millisecond, 0, 0, true},
		{"a message before the advisory", 300 * time.Millisecond, 200 * time.Millisecond, 0, true},
		{"sent after the election began", leaderGrace / 2, 0, 0, false},
		{"served after the advisory", 300 * time.Millisecond, -time.Millisecond, 0, false},
		{"a 409 came just before", 300 * time.Millisecond, 0, 500 * time.Millisecond, false},
		{"a 409 of an older change", 300 * time.Millisecond, 0, 2 * time.Second, true},
	}
	for _, c := range cases {
		w := &leaderWatch{sub: &nats.Subscription{}}
		_, done, closePull := w.open(nil)
		w.mu.Lock()
		w.started = now.Add(-c.started)
		if c.lastMsg != 0 {
			w.lastMsg = now.Add(-c.lastMsg)
		}
		if c.last409 != 0 {
			w.last409 = now.Add(-c.last409)
		}
		w.mu.Unlock()
		w.elected(now)
		select {
		case <-done:
		default:
		}
		voided := closePull()
		if voided != c.want {
			t.Errorf("%s: voided %v, want %v", c.name, voided, c.want)
		}
	}
	// No subscription (a consumer of one replica): the pull keeps
	// FetchMaxWait and nothing is voided.
	w := &leaderWatch{}
	opts, done, closePull := w.open(nil)
	if len(opts) != 1 || done != nil || closePull() {
		t.Errorf("without a subscription: %d options, done %v", len(opts), done)
	}
}
