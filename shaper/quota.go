package shaper

import (
	"sort"
	"time"
)

// Quota is the sliding-window quota of one lane (SPEC §3 Quota,
// rate.quota): beside the rate, at most Count departures in any window of
// Per. It keeps the instants of the last Count departures in a ring; the
// next departure may leave once the oldest of them is Per + QuotaMargin
// behind it, so for any i the departures i and i + Count are more than Per
// apart, and no window of length Per holds more than Count, at departure and
// at the downstream.
//
// Each departure counts from when its request reached the wire, when the
// sink reports it (Wired), else from its departure.
//
// Memory: one time.Duration (8 bytes) per departure of the window, allocated
// as departures happen, at most Count of them (8 MB for a count of
// 1,000,000; config caps count at 10,000,000). A coarser bucketed window
// would be smaller but would let a window at the downstream hold up to a
// bucket's worth more; the ring is exact.
//
// A Quota is not safe for concurrent use; every method is a pure function
// of the instants passed in. Instants must not go backwards (the departure
// loop's clock is monotonic).
type Quota struct {
	count int
	per   time.Duration
	base  time.Time       // instants are kept as offsets from base
	ring  []time.Duration // the last min(count, departures) departures; oldest at head once full
	head  int
}

// QuotaMargin is what the quota adds to Per between departure i and
// departure i + Count: 2 ms, so that the windows hold at the downstream too,
// where each request arrives after its own delay from departure to wire (a
// write descheduled for 300–430 µs was measured here, see jitterBudget); at
// a window of 1 s or more it costs under 0.2 % of the quota's time.
const QuotaMargin = 2 * time.Millisecond

// NewQuota returns a quota of count departures per window of per; start is
// any instant at or before the first departure. count ≤ 0 or per ≤ 0 never
// binds.
func NewQuota(count int, per time.Duration, start time.Time) *Quota {
	return &Quota{count: count, per: per, base: start}
}

// SetConfig changes the count and window in place (hot reload), keeping the
// departures recorded: the newest min(count, recorded) of them still count.
func (q *Quota) SetConfig(count int, per time.Duration) {
	ordered := q.ordered()
	if count > 0 && len(ordered) > count {
		ordered = ordered[len(ordered)-count:]
	}
	q.count, q.per, q.ring, q.head = count, per, ordered, 0
}

// ordered returns the recorded departures, oldest first.
func (q *Quota) ordered() []time.Duration {
	out := make([]time.Duration, 0, len(q.ring))
	out = append(out, q.ring[q.head:]...)
	return append(out, q.ring[:q.head]...)
}

// on reports whether the quota binds at all.
func (q *Quota) on() bool { return q.count > 0 && q.per > 0 }

// Per returns the quota's window, as configured (SetConfig).
func (q *Quota) Per() time.Duration { return q.per }

// Next returns the earliest instant at or after now at which one more
// departure keeps the quota: now while fewer than Count departures have
// been recorded, else Per + QuotaMargin after the oldest of the last Count.
func (q *Quota) Next(now time.Time) time.Time {
	if !q.on() || len(q.ring) < q.count {
		return now
	}
	if at := q.base.Add(q.ring[q.head] + q.per + QuotaMargin); at.After(now) {
		return at
	}
	return now
}

// Depart records a departure at now.
func (q *Quota) Depart(now time.Time) {
	if !q.on() {
		return
	}
	d := now.Sub(q.base)
	if len(q.ring) < q.count {
		q.ring = append(q.ring, d)
		return
	}
	q.ring[q.head] = d
	q.head = (q.head + 1) % len(q.ring)
}

// wiredScan is how many of the newest departures Wired looks through: the
// requests not yet on the wire are among the last max_in_flight departures.
const wiredScan = 64

// Wired records that the departure which left at departed reached the wire
// at wired (shaper.WithWire): the quota counts it from then, so that a
// request that left late — the first one pays its connection's dial — does
// not let the request Count departures later reach the downstream within
// Per of it. A departure not among the last wiredScan is left as it was.
func (q *Quota) Wired(departed, wired time.Time) {
	n := len(q.ring)
	if !q.on() || n == 0 || !wired.After(departed) {
		return
	}
	d, w := departed.Sub(q.base), wired.Sub(q.base)
	for k := 1; k <= min(n, wiredScan); k++ {
		i := (q.head - k + n) % n
		if q.ring[i] == d {
			q.ring[i] = w
			return
		}
		if q.ring[i] < d {
			return
		}
	}
}

// Remaining returns how many departures the quota allows in the window
// ending at now, in messages: Count less the departures in (now − Per,
// now]; -1 when there is no quota.
func (q *Quota) Remaining(now time.Time) int {
	if !q.on() {
		return -1
	}
	cut := now.Sub(q.base) - q.per
	n := len(q.ring)
	in := n - sort.Search(n, func(i int) bool { return q.ring[(q.head+i)%n] > cut })
	return max(0, q.count-in)
}
