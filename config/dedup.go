package config

// dedupWindow checks sink.dedup_window of the lane whose keys k builds
// (SPEC §4; SPEC §3 Delivered-key dedup). It must be ≥ 0 (0 = off). A
// window shorter than twice source.ack_wait is allowed but warned about:
// a message whose ack was lost (the case dedup exists for: a crash after
// the sink accepted it) comes back about ack_wait later, and a skipped
// duplicate's own ack can be lost once more; a key that has expired by
// then is delivered again.
func (v *validator) dedupWindow(k func(string) string, l Lane) {
	w := l.Sink.DedupWindow
	v.check(w >= 0, k("sink.dedup_window"), "must be ≥ 0 (0 = off), got %s", w)
	if w > 0 && l.Source.AckWait > 0 && w < 2*l.Source.AckWait && !v.p.skip(k("sink.dedup_window"), k("source.ack_wait")) {
		v.warn(k("sink.dedup_window"), "%s is shorter than twice source.ack_wait %s: a message whose ack was lost comes back about ack_wait later, and may find its key expired and be delivered again",
			w, l.Source.AckWait)
	}
}
