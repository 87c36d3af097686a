package daemon

// ResetBreaker closes the breaker of lane name (SPEC §3 Breaker: an
// operator's resume ends an open breaker, or the hold after a 410 Gone) and
// reports whether it was open. The lane resumes through its warmup ramp with
// no burst (drain.Lane.ResetBreaker). It fails when no lane has that name.
func (d *Daemon) ResetBreaker(name string) (bool, error) {
	rec, err := d.lane(name)
	if err != nil {
		return false, err
	}
	return rec.lane.ResetBreaker(), nil
}
