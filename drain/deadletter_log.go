package drain

import (
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"
)

// deadLetterLogEvery bounds the lines about dead letters: a downstream that
// answers 400 to everything dead-letters at the lane's rate, and one line per
// message drowned the logs (issue 12). The first dead letter after a quiet
// period is logged on its own line, with its msg_id; the ones that follow
// within deadLetterLogEvery are counted and logged as one summary line per
// period, with the count per reason. shaper_dead_letters_total{reason}
// counts every one.
const deadLetterLogEvery = 10 * time.Second

// deadLetterLog is the lane's rate limit on dead-letter log lines. Its zero
// value is ready; it is safe for concurrent use (tasks and the fetch loop
// dead-letter, the house loop flushes).
type deadLetterLog struct {
	mu     sync.Mutex
	last   time.Time      // when the last line (single or summary) was written
	counts map[string]int // dead letters by reason since then, not yet logged
}

// note records one dead letter at now and reports whether it gets a line of
// its own (the first after a period without lines).
func (d *deadLetterLog) note(now time.Time, reason string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last.IsZero() || now.Sub(d.last) >= deadLetterLogEvery {
		if len(d.counts) == 0 {
			d.last = now
			return true
		}
	}
	if d.counts == nil {
		d.counts = map[string]int{}
	}
	d.counts[reason]++
	return false
}

// take returns the counts not yet logged, when a period has passed since the
// last line or force is set, and starts a new period; nil when there is
// nothing to log yet.
func (d *deadLetterLog) take(now time.Time, force bool) map[string]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.counts) == 0 || (!force && now.Sub(d.last) < deadLetterLogEvery) {
		return nil
	}
	c := d.counts
	d.counts = nil
	d.last = now
	return c
}

// logDeadLetter writes the line of one dead letter, or counts it for the
// next summary (see deadLetterLogEvery).
func (l *Lane) logDeadLetter(msgID, reason string, attempt uint64) {
	if l.dlLog.note(time.Now(), reason) {
		l.log.Info("dead-lettered", "msg_id", msgID, "reason", reason, "attempt", attempt,
			"next_summary_in", deadLetterLogEvery)
	}
}

// flushDeadLetterLog writes the summary of the dead letters counted since
// the last line, once a period has passed (the house loop's tick) or at
// once with force (the end of a drain).
func (l *Lane) flushDeadLetterLog(now time.Time, force bool) {
	c := l.dlLog.take(now, force)
	if c == nil {
		return
	}
	total := 0
	attrs := make([]any, 0, 2*len(c)+2)
	for _, reason := range slices.Sorted(maps.Keys(c)) {
		total += c[reason]
		attrs = append(attrs, slog.Int(reason, c[reason]))
	}
	l.log.Info("dead-lettered since the last line", "count", total, slog.Group("by_reason", attrs...))
}
