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
	// shared is the end of a wait for the quota shared through Redis
	// (rate.global: GlobalSchedule.Reserve answered *QuotaWait); zero when
	// none. The replica's own ring (q) still counts its own departures:
	// the shared quota binds first, and in the fallback the ring alone
	// binds, at count / replicas_hint.
	shared time.Time
	// announced says that "quota spent" was logged for the current wait and
	// no departure has followed yet: one line per wait, also when a global
	// lane asks the shared quota again at the end of its wait and another
	// replica took the slot that freed (a second wait of the same window,
	// not a new one). The first departure after it logs "quota renewed".
	announced bool
	// loud says the current wait was logged at Info; loudUntil is when
	// the last such wait was to end as it began: where the quota's next
	// window opens (with a shared quota, maybe with another replica's
	// departure). A wait that ends before loudUntil + per is in that window
	// (a replay of the window before, where that one was slower: a late
	// wake-up, a dropped slot, the warmup) and is logged at Debug: at 50/s,
	// quota 30 per 2 s, two replicas, such waits of 40–80 ms came one or two
	// a window (TestGlobalQuotaTwoReplicas: 6–15 "quota spent" lines for 4
	// windows). The next window's wait ends at the earliest the quota's
	// margins (shaper.QuotaMargin) after loudUntil + per, and is logged at
	// Info.
	loud      bool
	loudUntil time.Time
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
		l.quota.announced = false
	case l.quota.q == nil:
		l.quota.q = shaper.NewQuota(l.quotaCount(q.Count), q.Per, now)
	default:
		l.quota.q.SetConfig(l.quotaCount(q.Count), q.Per)
	}
}

// quotaCount is the count the replica's own ring keeps: the whole count,
// or, while a global lane paces alone in the Redis fallback (limit /
// replicas_hint), its share count / replicas_hint (at least 1): with at
// most replicas_hint replicas, a window that lies wholly in the fallback
// holds at most count departures across them (docs/scaling.md "Quota
// across replicas" gives the bound of a window that spans the switch).
func (l *Lane) quotaCount(count int) int {
	if g := l.global; g != nil && g.reducedNow.Load() && count > 0 {
		return max(1, count/g.hint)
	}
	return count
}

// sharedQuotaWait records, with l.mu not held, that the shared quota is
// spent until until (global.go) and returns when the next departure may
// ask for a slot again; the wait goes the way of the replica's own quota
// wait (quotaUntil: the pacer held, shaper_lane_paused 1, no burst after).
func (l *Lane) sharedQuotaWait(until, now time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.quota.q == nil { // a reload took the quota away meanwhile
		return now
	}
	if !until.After(now) {
		// The answer's instant, converted to this clock after a round
		// trip, may already have passed: still no slot was taken, so the
		// loop must ask again, not depart.
		until = now.Add(time.Microsecond)
	}
	l.quota.shared = until
	at, _ := l.quotaUntil(now, now)
	return at
}

// quotaUntil returns, with l.mu held, the instant the quota lets the next
// departure leave, and whether the lane waits for the quota: whether that
// is after now and after paced, the instant the pacer (and the other
// gates) would let it leave. A quota that frees its slot by the pacer's
// time does not hold the lane (under a backlog each window after the first
// replays the first one's spacing, so it would otherwise hold, and log,
// between every two departures). While it waits the pacer is held
// (Pacer.Hold: the lane cools as if idle and its rate shows 0), and
// shaper_lane_paused shows it.
func (l *Lane) quotaUntil(now, paced time.Time) (time.Time, bool) {
	if l.quota.q == nil {
		return time.Time{}, false
	}
	at := l.quota.q.Next(now)
	if l.quota.shared.After(at) {
		at = l.quota.shared // the shared quota (rate.global)
	}
	held := at.After(now) && at.After(paced)
	if held {
		l.quota.end = at
	}
	if held != l.quota.held {
		l.quota.held = held
		l.syncPacerHold(now)
		if held {
			if !l.quota.announced {
				l.quota.announced = true
				l.quota.loud = l.quota.loudUntil.IsZero() || !at.Before(l.quota.loudUntil.Add(l.quota.q.Per()))
				if l.quota.loud {
					l.quota.loudUntil = at
					l.log.Info("quota spent: departures wait", "until", at.Format(time.RFC3339Nano))
				} else {
					l.log.Debug("quota spent again within its window: departures wait", "until", at.Format(time.RFC3339Nano))
				}
			}
			l.m.Paused.Set(1)
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
		l.quota.end, l.quota.shared = time.Time{}, time.Time{}
		if l.quota.held {
			l.quota.held = false
			l.syncPacerHold(now)
		}
		if l.quota.announced {
			l.quota.announced = false
			if l.quota.loud {
				l.log.Info("quota renewed: departures resume")
			} else {
				l.log.Debug("quota renewed: departures resume")
			}
		}
	}
}

// quotaRemaining returns what the quota allows in the window ending at now,
// in messages, or -1 without a quota (l.mu held). For a global lane on the
// shared schedule it is the shared quota's remainder at Redis's last
// answer (QuotaReporter), which counts every replica; in the fallback, and
// before that answer, the replica's own ring.
func (l *Lane) quotaRemaining(now time.Time) int {
	if l.quota.q == nil {
		return -1
	}
	if g := l.global; g != nil && !g.fallbackNow.Load() {
		if r, ok := g.g.(QuotaReporter); ok {
			if n := r.QuotaRemaining(); n >= 0 {
				return n
			}
		}
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
