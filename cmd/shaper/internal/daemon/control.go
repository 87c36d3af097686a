package daemon

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/shaper-dev/shaper/cmd/shaper/internal/admin"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/sources"
)

// Operator control (SPEC §3): the admin API's requests are written to the
// SHAPER_CONTROL bucket on the NATS server; every replica watches it and
// applies each lane's record to its lane. So a pause survives a restart
// (the record is read before the lanes start) and holds on every replica.

// controlReadyTimeout bounds the wait for the existing records at start.
const controlReadyTimeout = 5 * time.Second

// startControl opens the control bucket and watches it; it returns once
// the records that already exist were read.
func (d *Daemon) startControl(ctx context.Context) error {
	c, err := sources.OpenControl(ctx, d.js, maxReplicas(d.cfg), sources.WithControlLogger(d.log)) // created with the largest source.replicas
	if err != nil {
		return err
	}
	d.control = c
	d.ctl = map[string]sources.LaneControl{}
	ready, stop, err := c.Watch(context.Background(), d.applyControl)
	if err != nil {
		return err
	}
	d.ctlStop = stop
	select {
	case <-ready:
	case <-time.After(controlReadyTimeout):
		return fmt.Errorf("control bucket %s: existing records not read within %s", sources.ControlBucket, controlReadyTimeout)
	}
	return nil
}

// applyControl keeps the lane's latest record and applies it to the lane
// when it runs (the control watch calls it).
func (d *Daemon) applyControl(name string, lc sources.LaneControl) {
	d.ctlMu.Lock()
	prev := d.ctl[name]
	d.ctl[name] = lc
	d.ctlMu.Unlock()
	if rec := d.laneRec(name); rec != nil {
		applyTo(rec.lane, lc)
		if lc.ResumedAt.After(prev.ResumedAt) {
			rec.lane.ResetBreaker() // an operator's resume also closes an open breaker
		}
	}
}

// applyStored applies the lane's stored record to a lane not yet started.
func (d *Daemon) applyStored(name string, l *drain.Lane) {
	d.ctlMu.Lock()
	lc, ok := d.ctl[name]
	d.ctlMu.Unlock()
	if ok {
		applyTo(l, lc)
	}
}

// purgeMark is the purge lc records.
func purgeMark(lc sources.LaneControl) drain.PurgeMark {
	return drain.PurgeMark{Stream: lc.PurgeStream, UpTo: lc.PurgeUpTo, Before: lc.PurgeBefore}
}

// applyTo makes l follow lc: hold or resume, and purge up to its watermark.
func applyTo(l *drain.Lane, lc sources.LaneControl) {
	now := time.Now()
	if p := lc.Pause; p != nil && (p.Until.IsZero() || now.Before(p.Until)) {
		l.Hold(drain.Hold{Until: p.Until, Reason: p.Reason})
	} else if _, held := l.HoldState(now); held {
		l.Resume()
	}
	if lc.PurgeUpTo > 0 {
		l.Purge(purgeMark(lc))
	}
}

// setLane records rec as the running lane name; dropLane forgets it.
func (d *Daemon) setLane(name string, rec *laneRec) {
	d.lanes[name] = rec
	d.liveMu.Lock()
	if d.live == nil {
		d.live = map[string]*laneRec{}
	}
	d.live[name] = rec
	d.liveMu.Unlock()
}

func (d *Daemon) dropLane(name string) {
	delete(d.lanes, name)
	d.liveMu.Lock()
	delete(d.live, name)
	d.liveMu.Unlock()
}

func (d *Daemon) laneRec(name string) *laneRec {
	d.liveMu.RLock()
	defer d.liveMu.RUnlock()
	return d.live[name]
}

func (d *Daemon) lane(name string) (*laneRec, error) {
	if rec := d.laneRec(name); rec != nil {
		return rec, nil
	}
	return nil, fmt.Errorf("lane %q: %w", name, admin.ErrNoLane)
}

// Lanes returns every running lane's view, by name (admin.Lanes).
func (d *Daemon) Lanes(ctx context.Context) []admin.LaneView {
	d.liveMu.RLock()
	names := make([]string, 0, len(d.live))
	for name := range d.live {
		names = append(names, name)
	}
	d.liveMu.RUnlock()
	sort.Strings(names)
	out := make([]admin.LaneView, 0, len(names))
	for _, name := range names {
		if v, err := d.Lane(ctx, name); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// Lane returns the lane's view (admin.Lanes).
func (d *Daemon) Lane(ctx context.Context, name string) (admin.LaneView, error) {
	rec, err := d.lane(name)
	if err != nil {
		return admin.LaneView{}, err
	}
	st := rec.lane.Status(time.Now())
	v := admin.LaneView{Lane: name, State: st.State, Limit: st.Limit, Rate: st.Rate, Achieved: st.Achieved,
		Depth: st.Depth, Capacity: st.Capacity, InFlight: st.InFlight, LastError: redactError(st.LastError),
		QueueWaitP99: st.QueueWaitP99.Seconds()}
	if st.QuotaRemaining >= 0 {
		q := st.QuotaRemaining
		v.QuotaRemaining = &q
	}
	if st.State == drain.StatePaused && !st.PausedUntil.IsZero() {
		u := st.PausedUntil
		v.PausedUntil = &u
	}
	switch {
	case st.State == drain.StateOpen && st.BreakerHeld:
		v.PauseReason = "breaker held after 410 Gone: resume to close it"
	case st.State == drain.StateOpen:
		v.PauseReason = "breaker open: probing"
	}
	if st.Hold != nil {
		v.PauseReason = st.Hold.Reason
		if v.PauseReason == "" {
			v.PauseReason = "operator"
		}
	} else if st.State == drain.StatePaused && st.QuotaWait {
		v.PauseReason = "quota spent"
	} else if st.State == drain.StatePaused {
		v.PauseReason = "downstream Retry-After"
	}
	if d.natsUp() == nil {
		cctx, cancel := context.WithTimeout(ctx, deadCountTimeout)
		if n, err := d.deadLetters(rec).Count(cctx); err == nil {
			rec.deadCount.Store(n)
		}
		cancel()
	}
	v.DeadLetters = rec.deadCount.Load() // the last count read when NATS does not answer
	return v, nil
}

// deadCountTimeout bounds the dead-letter count of a lane's view: a view
// (shaper lanes, the console's poll each second) never waits the
// JetStream API's 5 s for it; the last count read stands in.
const deadCountTimeout = time.Second

// natsUp is nil while the daemon's NATS connection is up, and otherwise an
// admin.ErrUnavailable that says so: an operator's request that needs the
// server is answered at once (503, nothing changed) instead of after the
// JetStream API's 5 s timeout (found by a new-user pass: every command
// took 5 s, and shaper lanes 5 s per lane, while NATS was down).
func (d *Daemon) natsUp() error {
	if d.nc != nil && d.nc.IsConnected() {
		return nil
	}
	status := "not connected"
	if d.nc != nil {
		status = strings.ToLower(d.nc.Status().String())
	}
	return fmt.Errorf("%w: the NATS server is not reachable (connection %s): nothing was changed; ask again once /readyz is 200", admin.ErrUnavailable, status)
}

func (d *Daemon) deadLetters(rec *laneRec) sources.DeadLetters {
	return sources.DeadLetters{JS: d.js, Subject: rec.cfg.DeadLetter.Subject}
}

// Pause pauses the lane on every replica for dur (0: until resumed).
func (d *Daemon) Pause(ctx context.Context, name string, dur time.Duration, reason string) error {
	rec, err := d.lane(name)
	if err != nil {
		return err
	}
	if err := d.natsUp(); err != nil {
		return err
	}
	now := time.Now()
	p := &sources.PauseRecord{Reason: reason, At: now}
	if dur > 0 {
		p.Until = now.Add(dur)
	}
	lc, err := d.control.Update(ctx, name, func(lc *sources.LaneControl) { lc.Pause = p })
	if err != nil {
		return controlErr(err)
	}
	applyTo(rec.lane, lc) // at once here; the watch brings it to the others
	return nil
}

// Resume ends an operator's pause and an open breaker on every replica. It
// is a conflict (admin.ErrConflict) when neither was in force but the
// downstream's Retry-After pauses the lane: resume does not end that.
func (d *Daemon) Resume(ctx context.Context, name string) error {
	rec, err := d.lane(name)
	if err != nil {
		return err
	}
	if err := d.natsUp(); err != nil {
		return err
	}
	now := time.Now()
	_, held := rec.lane.HoldState(now)
	open, _ := rec.lane.BreakerOpen()
	if st := rec.lane.Status(now); !held && !open && st.State == drain.StatePaused && st.QuotaWait {
		return fmt.Errorf("%w: lane %q waits for its quota (rate.quota) until %s; resume ends only an operator's pause or an open breaker",
			admin.ErrConflict, name, st.PausedUntil.Format(time.RFC3339))
	} else if !held && !open && st.State == drain.StatePaused {
		return fmt.Errorf("%w: lane %q is paused by the downstream's Retry-After until %s; resume ends only an operator's pause or an open breaker",
			admin.ErrConflict, name, st.PausedUntil.Format(time.RFC3339))
	}
	lc, err := d.control.Update(ctx, name, func(lc *sources.LaneControl) {
		lc.Pause, lc.ResumedAt = nil, time.Now()
	})
	if err != nil {
		return controlErr(err)
	}
	applyTo(rec.lane, lc)
	rec.lane.ResetBreaker()
	return nil
}

// controlErr says that an operator's decision could not be kept on the
// NATS server.
func controlErr(err error) error {
	return fmt.Errorf("keeping the decision in %s on the NATS server: %w", sources.ControlBucket, err)
}

// DeadLetters lists the lane's dead letters.
func (d *Daemon) DeadLetters(ctx context.Context, name string, f sources.DeadLetterFilter) ([]sources.DeadLetter, error) {
	rec, err := d.lane(name)
	if err != nil {
		return nil, err
	}
	if err := d.natsUp(); err != nil {
		return nil, err
	}
	list, err := d.deadLetters(rec).List(ctx, f)
	for i := range list {
		list[i].LastError = redactError(list[i].LastError)
	}
	return list, err
}

// Replay republishes the lane's chosen dead letters through the lane.
func (d *Daemon) Replay(ctx context.Context, name string, f sources.DeadLetterFilter) (int, error) {
	rec, err := d.lane(name)
	if err != nil {
		return 0, err
	}
	if err := d.natsUp(); err != nil {
		return 0, err
	}
	n, err := d.deadLetters(rec).Replay(ctx, f)
	if err != nil {
		err = fmt.Errorf("replayed %d, then: %w", n, err)
	}
	if err != nil {
		d.log.Warn("dead letters replayed by operator, then failed", "lane", name, "replayed", n, "reason", f.Reason, "err", err)
	} else {
		d.log.Info("dead letters replayed by operator", "lane", name, "replayed", n, "reason", f.Reason)
	}
	return n, err
}

// Purge dead-letters, on every replica, what the lane holds and what its
// consumer has pending up to the source stream's last sequence now.
func (d *Daemon) Purge(ctx context.Context, name string) (admin.PurgeResult, error) {
	rec, err := d.lane(name)
	if err != nil {
		return admin.PurgeResult{}, err
	}
	if err := d.natsUp(); err != nil {
		return admin.PurgeResult{}, err
	}
	st, err := d.js.Stream(ctx, rec.cfg.Source.Stream)
	if err != nil {
		return admin.PurgeResult{}, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return admin.PurgeResult{}, err
	}
	res := admin.PurgeResult{UpToSeq: info.State.LastSeq}
	mark := drain.PurgeMark{Stream: info.Config.Name, UpTo: info.State.LastSeq, Before: info.State.LastTime}
	// This replica first, so that the answer counts what its bucket held;
	// then the record, which the others (and a restart) apply.
	res.Held = rec.lane.Purge(mark)
	if _, err := d.control.Update(ctx, name, func(lc *sources.LaneControl) {
		m := purgeMark(*lc).Merge(mark)
		lc.PurgeUpTo, lc.PurgeStream, lc.PurgeBefore = m.UpTo, m.Stream, m.Before
	}); err != nil {
		return res, controlErr(err)
	}
	if c, err := d.js.Consumer(ctx, rec.cfg.Source.Stream, rec.cfg.Source.Consumer); err == nil {
		if ci, err := c.Info(ctx); err == nil {
			res.Pending = ci.NumPending
		}
	}
	return res, nil
}

// userinfoRE matches the user:password@ of a URL inside a text.
var userinfoRE = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@`)

// redactError hides the credentials of any URL in an error's text (a sink
// error quotes its URL), for the admin API and the console.
func redactError(s string) string { return userinfoRE.ReplaceAllString(s, "${1}***@") }
