package shaper

import (
	"time"
)

// BreakerConfig is the configuration of a lane's breaker (SPEC §3 Breaker,
// the keys task.breaker.*).
type BreakerConfig struct {
	// FailureRatio is the share of failed attempts, in [0, 1], at which the
	// breaker opens; 0 turns the breaker off (it never opens, and a 410 Gone
	// holds nothing).
	FailureRatio float64
	// MinAttempts is how many counted attempts must have ended within
	// Window before the ratio is judged, in attempts; ≥ 1.
	MinAttempts int
	// Window is how far back attempts count: an attempt that ended at e
	// counts at t when t − Window < e ≤ t. > 0.
	Window time.Duration
	// ProbeEvery is the time from the opening to the first probe, and from
	// one probe's departure to the next; > 0.
	ProbeEvery time.Duration
}

// On reports whether the breaker is on (FailureRatio > 0).
func (c BreakerConfig) On() bool { return c.FailureRatio > 0 }

// Attempt is how one finished delivery attempt counts for the breaker (SPEC
// §3 Breaker: network error, timeout and 5xx fail).
type Attempt int

const (
	// AttemptNeutral counts neither way: the downstream answered about this
	// message or about the pace (a 4xx other than 410: 400, 404, 408, 429,
	// …), which says nothing about whether it is up. Not in the window.
	AttemptNeutral Attempt = iota
	// AttemptSuccess: the sink accepted the message.
	AttemptSuccess
	// AttemptFailure: a network error, the task timeout, or a 5xx.
	AttemptFailure
	// AttemptGone: the downstream answered 410 Gone; the breaker is held
	// open until Reset.
	AttemptGone
)

// String returns the attempt's name, for logs.
func (a Attempt) String() string {
	switch a {
	case AttemptSuccess:
		return "success"
	case AttemptFailure:
		return "failure"
	case AttemptGone:
		return "gone"
	default:
		return "neutral"
	}
}

// BreakerState is where a breaker is.
type BreakerState int

const (
	// BreakerClosed: every departure may leave.
	BreakerClosed BreakerState = iota
	// BreakerOpen: departures stop; one probe may leave every ProbeEvery.
	BreakerOpen
	// BreakerHeld: open after a 410 Gone, with no probes, until Reset (an
	// operator's resume).
	BreakerHeld
)

// String returns closed, open or held.
func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHeld:
		return "held"
	default:
		return "closed"
	}
}

// Breaker is the circuit breaker of one lane (SPEC §3 Breaker) as a pure
// state machine on instants: it reads no clock and never blocks.
//
//   - Opening. When an attempt that counts (AttemptSuccess or
//     AttemptFailure) ends at t while closed, the breaker judges the attempts
//     that ended in (t − Window, t] since it last closed: when they are at
//     least MinAttempts and at least FailureRatio of them failed, it opens at
//     t. It is judged when an attempt ends, not in between: a success leaving
//     the window does not open it by itself, the next failure does.
//   - Open. Departures stop (Gate). The first probe may leave ProbeEvery
//     after the opening, each later one ProbeEvery after the previous probe's
//     departure, and never while a probe is in flight. A probe that succeeds
//     closes the breaker; one that fails or counts neither way keeps it open.
//     Attempts that departed before the opening and end while it is open are
//     not counted: only a probe judges an open breaker.
//   - Held. An AttemptGone (410), in any state, holds the breaker open with
//     no probes; only Reset closes it.
//   - Closing (a probe's success, Reset, SetConfig turning it off) forgets
//     the window: failures from before the opening do not reopen it.
//
// Memory: 8 bytes per counted attempt in the window while closed (at
// 10,000/s and a 30 s window, 2.4 MB); none when off. A Breaker is not safe
// for concurrent use (the drain package guards it with the lane's mutex).
type Breaker struct {
	cfg   BreakerConfig
	state BreakerState

	epoch    time.Time // instants are stored as nanoseconds since epoch
	ends     []int64   // counted attempts in the window: ns since epoch << 1 | failed
	head     int       // ends[head:] is the window
	failures int       // failed attempts in ends[head:]

	openedAt  time.Time // when it opened (or was held)
	probeBase time.Time // the opening, then the last probe's departure
	probing   bool      // a probe is in flight
}

// NewBreaker returns a closed breaker for cfg; start is the earliest instant
// it will be given.
func NewBreaker(cfg BreakerConfig, start time.Time) *Breaker {
	return &Breaker{cfg: cfg, epoch: start}
}

// Config returns the configuration in force.
func (b *Breaker) Config() BreakerConfig { return b.cfg }

// SetConfig applies cfg from now on (hot reload): the window is judged with
// the new values from the next attempt that ends, and an open breaker probes
// at the new ProbeEvery from its last probe. Turning the breaker off
// (FailureRatio 0) closes it; it then reports true.
func (b *Breaker) SetConfig(cfg BreakerConfig, now time.Time) (closed bool) {
	b.cfg = cfg
	if !cfg.On() {
		b.clearWindow()
		if b.state != BreakerClosed {
			b.close()
			return true
		}
	}
	return false
}

// State returns the breaker's state.
func (b *Breaker) State() BreakerState { return b.state }

// OpenedAt returns when the breaker last opened or was held; the zero time
// when it never did.
func (b *Breaker) OpenedAt() time.Time { return b.openedAt }

// Counts returns the counted attempts, and of them the failed ones, that
// ended in (now − Window, now] since the breaker last closed, as they stood
// when it opened while it is open.
func (b *Breaker) Counts(now time.Time) (attempts, failures int) {
	if b.state == BreakerClosed {
		b.expire(now)
	}
	return len(b.ends) - b.head, b.failures
}

// Gate tells the departure loop whether a departure may leave at now. wait
// is false when the breaker is closed, or open with a probe allowed at now
// (the departure that leaves is the probe: call Depart). Otherwise wait is
// true and until is when a probe may leave, or the zero time when no
// instant is known: held, or a probe in flight (wait for a change).
func (b *Breaker) Gate(now time.Time) (wait bool, until time.Time) {
	switch b.state {
	case BreakerClosed:
		return false, time.Time{}
	case BreakerHeld:
		return true, time.Time{}
	}
	if b.probing {
		return true, time.Time{}
	}
	next := b.probeBase.Add(b.cfg.ProbeEvery)
	if now.Before(next) {
		return true, next
	}
	return false, time.Time{}
}

// Depart records that a departure left at now and reports whether it is the
// probe: true when the breaker is open, no probe is in flight and one is
// due (Gate). Report the probe's end with Record(…, true).
func (b *Breaker) Depart(now time.Time) (probe bool) {
	if wait, _ := b.Gate(now); b.state != BreakerOpen || wait {
		return false
	}
	b.probing, b.probeBase = true, now
	return true
}

// Record records an attempt that ended at now with a; probe is true for the
// end of the departure Depart called the probe. It returns the state after
// it and whether the state changed.
func (b *Breaker) Record(now time.Time, a Attempt, probe bool) (BreakerState, bool) {
	if !b.cfg.On() {
		return b.state, false
	}
	if probe {
		b.probing = false
	}
	if a == AttemptGone {
		if b.state == BreakerHeld {
			return b.state, false
		}
		b.state, b.openedAt, b.probing = BreakerHeld, now, false
		return b.state, true
	}
	switch b.state {
	case BreakerHeld:
		return b.state, false
	case BreakerOpen:
		if probe && a == AttemptSuccess {
			b.close()
			return b.state, true
		}
		return b.state, false
	}
	if a != AttemptSuccess && a != AttemptFailure {
		return b.state, false
	}
	b.expire(now)
	v := now.Sub(b.epoch).Nanoseconds() << 1
	if a == AttemptFailure {
		v |= 1
		b.failures++
	}
	b.ends = append(b.ends, v)
	if n := len(b.ends) - b.head; n >= b.cfg.MinAttempts && float64(b.failures)/float64(n) >= b.cfg.FailureRatio {
		b.state, b.openedAt, b.probeBase, b.probing = BreakerOpen, now, now, false
		return b.state, true
	}
	return b.state, false
}

// Reset closes the breaker, whatever its state (an operator's resume, SPEC
// §3 Breaker), and reports whether it was open or held. A probe still in
// flight then ends as an ordinary attempt.
func (b *Breaker) Reset(now time.Time) bool {
	if b.state == BreakerClosed {
		return false
	}
	b.close()
	return true
}

func (b *Breaker) close() {
	b.state, b.probing = BreakerClosed, false
	b.clearWindow()
}

func (b *Breaker) clearWindow() {
	b.ends, b.head, b.failures = b.ends[:0], 0, 0
}

// expire drops the attempts that ended at or before now − Window.
func (b *Breaker) expire(now time.Time) {
	cut := now.Add(-b.cfg.Window).Sub(b.epoch).Nanoseconds()
	for b.head < len(b.ends) && b.ends[b.head]>>1 <= cut {
		b.failures -= int(b.ends[b.head] & 1)
		b.head++
	}
	if b.head == len(b.ends) {
		b.ends, b.head = b.ends[:0], 0
	} else if b.head >= 1024 && b.head >= len(b.ends)/2 {
		b.ends = b.ends[:copy(b.ends, b.ends[b.head:])]
		b.head = 0
	}
}
