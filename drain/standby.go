package drain

import (
	"context"
	"time"

	"github.com/shaper-dev/shaper/shaper"
)

// PinKeeper is implemented by sources whose replicas form a pinned-client
// group (source.standby; SPEC §3 Standby; sources.JetStream): only the
// pinned replica receives messages.
//
// Contract: Standby reports whether the lane's source is standby at all
// (the rest applies only then). Active reports whether this replica holds the pin; it may be
// called from any goroutine. KeepPin renews the pin of an active replica
// without taking any message, so that it keeps the pin while its bucket is
// full and it fetches nothing; it does nothing while the replica is not
// active, and returns within a few seconds. The lane calls KeepPin from
// one goroutine, every keepPinEvery, until the lane has drained.
type PinKeeper interface {
	Standby() bool
	Active() bool
	KeepPin(ctx context.Context) error
}

// keepPinEvery is how often the lane renews its pin (PinKeeper): well
// within sources.StandbyPinnedTTL.
const keepPinEvery = 500 * time.Millisecond

// laneStandby is the lane's side of standby.
type laneStandby struct {
	pins   PinKeeper     // nil: the source is not a PinKeeper
	active bool          // departLoop only: Active at its last look
	done   chan struct{} // closed when pinLoop returned
}

// pinLoop renews the pin while the lane runs, and hands back what the
// bucket holds when this replica lost the pin to another one (it was cut
// off longer than the server's pinned TTL): from then on another replica
// paces the lane, and what this one still held would depart beside it.
func (l *Lane) pinLoop() {
	defer close(l.standby.done)
	tick := time.NewTicker(keepPinEvery)
	defer tick.Stop()
	was := l.standby.pins.Active()
	for {
		select {
		case <-l.houseStop:
			return
		case <-tick.C:
		}
		if err := l.standby.pins.KeepPin(context.Background()); err != nil {
			l.log.Debug("standby: keeping the pin failed", "err", err)
		}
		active := l.standby.pins.Active()
		if was && !active && !l.draining.Load() {
			n := 0
			for {
				m, _ := l.bucket.Pop()
				if m == nil {
					break
				}
				n++
				l.nak(m, 0, shaper.RetryDrain)
			}
			l.m.BucketDepth.Set(0)
			l.log.Warn("standby: lost the pin, handed back what the bucket held", "messages", n)
		}
		was = active
	}
}

// takeover holds the first departure of a replica that has just become the
// active one of a standby lane for one interval from now (a conservative
// start, docs/scaling.md): it cannot know when the replica before it
// departed last, only that it did so before now.
func (l *Lane) takeover(now time.Time) {
	if l.standby.pins == nil {
		return
	}
	active := l.standby.pins.Active()
	if active && !l.standby.active {
		l.mu.Lock()
		iv := shaper.Limit(l.pacer.RampRate(now)).Interval()
		l.pacer.Pause(now.Add(iv))
		l.mu.Unlock()
		l.log.Info("standby: this replica is active: the first departure waits one interval", "wait", iv)
	}
	l.standby.active = active
}
