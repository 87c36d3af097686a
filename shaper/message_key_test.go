package shaper

import "testing"

// TestKeyOfAReplay: a replayed dead letter keeps its original key (G8) from
// Shaper-Key; Shaper-Key alone, without Shaper-Replay-Of, does not override
// Nats-Msg-Id.
func TestKeyOfAReplay(t *testing.T) {
	for _, c := range []struct {
		h    map[string][]string
		want string
	}{
		{map[string][]string{MsgIDHeader: {"order-1"}}, "order-1"},
		{nil, "S:7"},
		{map[string][]string{MsgIDHeader: {"replay/x"}, KeyHeader: {"order-1"}, ReplayOfHeader: {"12"}}, "order-1"},
		{map[string][]string{MsgIDHeader: {"order-2"}, KeyHeader: {"order-1"}}, "order-2"},
	} {
		m := &Message{Stream: "S", StreamSeq: 7, Header: c.h}
		if got := m.Key(); got != c.want {
			t.Errorf("Key of %v = %q, want %q", c.h, got, c.want)
		}
	}
}
