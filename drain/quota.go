package drain

import (
	"time"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/shaper"
)

// laneQuota is the quota of a lane (rate.quota, SPEC §3 Quota; the rule is
// shaper.Quota): one more gate of the departure loop, beside the pacer.
// Guarded by the lane's mutex.
type laneQuota struct {
	q    *shaper.Quota // nil = no quota
	held bool          // the last departure decision waited for the quota
	end  time.Time     // when that wait ends
}

// setQuota turns the quota on, off or changes it for cfg (New, Update), with
// l.mu held; the departures recorded still count after a reload.
func (l *Lane) setQuota(cfg config.Lane, now time.Time) {
	q := cfg.Rate.Quota
	switch {
	case q.Count <= 0:
		l.quota.q = nil
		if l.quota.held { // a reload ended the wait
			l.quota.held = false
			l.syncPacerHold(now)
		}
	case l.quota.q == nil:
		l.quota.q = shaper.NewQuota(q.Count, q.Per, now)
	default:
		l.quota.q.SetConfig(q.Count, q.Per)
	}
}

// quotaUntil returns, with l.mu held, the instant the quota lets the next
// departure leave, and whether that is after now (the lane waits for the
// quota). While it waits the pacer is held (Pacer.Hold: the lane cools as if
// idle and its rate shows 0), and shaper_lane_paused shows it.
func (l *Lane) quotaUntil(now time.Time) (time.Time, bool) {
	if l.quota.q == nil {
		return time.Time{}, false
	}
	at := l.quota.q.Next(now)
	held := at.After(now)
	if held {
		l.quota.end = at
	}
	if held != l.quota.held {
		l.quota.held = held
		l.syncPacerHold(now)
		if held {
			l.log.Info("quota spent: departures wait", "until", at.Format(time.RFC3339Nano))
			l.m.Paused.Set(1)
		} else {
			l.log.Info("quota renewed: departures resume")
		}
	}
	return at, held
}

// quotaReady returns when the work of a departure at now was ready for the
// pacer: not before the end of a quota wait it went through, so that the
// wait earns no lateness to make up and no burst follows it (SPEC §3 Quota,
// G2; Pacer.Depart treats the end of a Retry-After pause the same way).
func (l *Lane) quotaReady(ready, now time.Time) time.Time {
	if l.quota.q == nil || l.quota.end.IsZero() || l.quota.end.After(now) {
		return ready
	}
	if l.quota.end.After(ready) {
		ready = l.quota.end
	}
	return ready
}

// quotaDepart records a departure at now (l.mu held).
func (l *Lane) quotaDepart(now time.Time) {
	if l.quota.q != nil {
		l.quota.q.Depart(now)
		l.quota.end = time.Time{}
		if l.quota.held {
			l.quota.held = false
			l.syncPacerHold(now)
		}
	}
}

// quotaRemaining returns what the quota allows in the window ending at now,
// in messages, or -1 without a quota (l.mu held).
func (l *Lane) quotaRemaining(now time.Time) int {
	if l.quota.q == nil {
		return -1
	}
	return l.quota.q.Remaining(now)
}

// quotaWired counts the departure at departed from when it reached the wire
// (l.mu held; see shaper.Quota.Wired).
func (l *Lane) quotaWired(departed, wired time.Time) {
	if l.quota.q != nil {
		l.quota.q.Wired(departed, wired)
	}
}
