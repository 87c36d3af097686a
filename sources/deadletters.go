package sources

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/shaper-dev/shaper/shaper"
)

// Dead-letter headers read back by list and replay (written by the worker,
// drain/deadletter.go; SPEC §3 Dead letter).
const (
	dlReason     = "Shaper-Reason"
	dlAttempts   = "Shaper-Attempts"
	dlLastStatus = "Shaper-Last-Status"
	dlLastError  = "Shaper-Last-Error"
	dlStream     = "Shaper-Stream"
	dlStreamSeq  = "Shaper-Stream-Seq"
	dlDownstream = "Shaper-Downstream"
)

// DeadLetter is one dead letter as the admin API lists it (SPEC §6).
type DeadLetter struct {
	Seq        uint64    `json:"seq"` // in the dead-letter stream
	Key        string    `json:"key"` // the message's idempotency key (G8)
	Reason     string    `json:"reason"`
	Attempts   int       `json:"attempts"`
	LastStatus int       `json:"last_status,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	Subject    string    `json:"subject,omitempty"` // the original subject
	Time       time.Time `json:"time"`              // when it was dead-lettered
}

// DeadLetterFilter chooses dead letters: by reason ("" = any), dead-lettered
// at or after Since (zero = any), at most Limit (0 = all).
type DeadLetterFilter struct {
	Reason string
	Since  time.Time
	Limit  int
}

// DeadLetters reads and replays the dead letters of one lane: those on
// Subject in the stream that captures it.
type DeadLetters struct {
	JS      jetstream.JetStream
	Subject string // the lane's dead_letter.subject
}

// stream returns the stream capturing d.Subject.
func (d DeadLetters) stream(ctx context.Context) (jetstream.Stream, error) {
	name, err := d.JS.StreamNameBySubject(ctx, d.Subject)
	if err != nil {
		return nil, fmt.Errorf("dead-letter stream of %q: %w", d.Subject, err)
	}
	return d.JS.Stream(ctx, name)
}

// Count returns how many dead letters the lane has in its stream.
func (d DeadLetters) Count(ctx context.Context) (uint64, error) {
	st, err := d.stream(ctx)
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(d.Subject))
	if err != nil {
		return 0, err
	}
	return info.State.Subjects[d.Subject], nil
}

// each calls f with every dead letter that matches filter (Limit ignored),
// oldest first, until f returns false.
func (d DeadLetters) each(ctx context.Context, filter DeadLetterFilter, f func(jetstream.Msg, DeadLetter) bool) error {
	st, err := d.stream(ctx)
	if err != nil {
		return err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(d.Subject))
	if err != nil {
		return err
	}
	if info.State.Subjects[d.Subject] == 0 {
		return nil
	}
	occ := jetstream.OrderedConsumerConfig{FilterSubjects: []string{d.Subject}}
	if !filter.Since.IsZero() {
		occ.DeliverPolicy, occ.OptStartTime = jetstream.DeliverByStartTimePolicy, &filter.Since
	}
	c, err := st.OrderedConsumer(ctx, occ)
	if err != nil {
		return err
	}
	// Read whole batches, even past the last wanted one: a batch left
	// unread keeps the client's fetch goroutine waiting.
	for done := false; !done; {
		batch, err := c.FetchNoWait(256)
		if err != nil {
			return err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if done {
				continue
			}
			meta, err := m.Metadata()
			if err != nil {
				return err
			}
			dl := parseDeadLetter(m, meta)
			if (filter.Reason == "" || dl.Reason == filter.Reason) && !f(m, dl) || meta.NumPending == 0 {
				done = true
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if n == 0 {
			return nil
		}
	}
	return nil
}

func parseDeadLetter(m jetstream.Msg, meta *jetstream.MsgMetadata) DeadLetter {
	h := m.Headers()
	dl := DeadLetter{Seq: meta.Sequence.Stream, Key: h.Get(shaper.KeyHeader), Reason: h.Get(dlReason),
		LastError: h.Get(dlLastError), Subject: h.Get(shaper.SubjectHeader), Time: meta.Timestamp}
	dl.Attempts, _ = strconv.Atoi(h.Get(dlAttempts))
	dl.LastStatus, _ = strconv.Atoi(h.Get(dlLastStatus))
	return dl
}

// List returns the dead letters that match filter, oldest first.
func (d DeadLetters) List(ctx context.Context, filter DeadLetterFilter) ([]DeadLetter, error) {
	out := []DeadLetter{}
	err := d.each(ctx, filter, func(_ jetstream.Msg, dl DeadLetter) bool {
		out = append(out, dl)
		return filter.Limit <= 0 || len(out) < filter.Limit
	})
	return out, err
}

// Replay republishes the dead letters that match filter (at most Limit) to
// their original subjects, so they travel through the lane again at its
// rate (SPEC §3 Operator control): with their payload and original headers,
// Shaper-Key (the original key, G8) and Shaper-Replay-Of (the dead letter's
// sequence), under a Nats-Msg-Id of their own ("replay/<stream>/<seq>"): the
// original's id may still be in the source stream's duplicate window, which
// would acknowledge the republish and store nothing. A dead letter is
// deleted only after its republish was acknowledged. It returns how many
// were replayed; on an error, those before it stay replayed.
func (d DeadLetters) Replay(ctx context.Context, filter DeadLetterFilter) (int, error) {
	st, err := d.stream(ctx)
	if err != nil {
		return 0, err
	}
	stream := st.CachedInfo().Config.Name
	var todo []jetstream.Msg
	var dls []DeadLetter
	if err := d.each(ctx, filter, func(m jetstream.Msg, dl DeadLetter) bool {
		todo, dls = append(todo, m), append(dls, dl)
		return filter.Limit <= 0 || len(todo) < filter.Limit
	}); err != nil {
		return 0, err
	}
	n := 0
	for i, m := range todo {
		msg, err := d.replayMsg(ctx, stream, m, dls[i])
		if err != nil {
			return n, err
		}
		if _, err := d.JS.PublishMsg(ctx, msg); err != nil {
			return n, fmt.Errorf("replay of dead letter %d: publish to %s: %w", dls[i].Seq, msg.Subject, err)
		}
		// Not found: another replay deleted it meanwhile (its republish is
		// the same message under the same id, dropped as a duplicate).
		if err := st.DeleteMsg(ctx, dls[i].Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && !strings.Contains(err.Error(), "not found") {
			return n, fmt.Errorf("replay of dead letter %d: republished, but not deleted: %w", dls[i].Seq, err)
		}
		n++
	}
	return n, nil
}

// replayMsg builds the republish of dead letter m.
func (d DeadLetters) replayMsg(ctx context.Context, stream string, m jetstream.Msg, dl DeadLetter) (*nats.Msg, error) {
	h := m.Headers()
	subject := dl.Subject
	if subject == "" { // dead letters written before Shaper-Subject: ask the source stream
		seq, _ := strconv.ParseUint(h.Get(dlStreamSeq), 10, 64)
		if src, err := d.JS.Stream(ctx, h.Get(dlStream)); err == nil {
			if raw, err := src.GetMsg(ctx, seq); err == nil {
				subject = raw.Subject
			}
		}
		if subject == "" {
			return nil, fmt.Errorf("dead letter %d has no %s and its source message %s:%d is gone: replay it by hand",
				dl.Seq, shaper.SubjectHeader, h.Get(dlStream), seq)
		}
	}
	out := nats.Header{}
	for k, v := range h {
		switch {
		case k == shaper.MsgIDHeader, k == shaper.KeyHeader, k == shaper.ReplayOfHeader, k == shaper.SubjectHeader:
		case k == dlReason, k == dlAttempts, k == dlLastStatus, k == dlLastError, k == dlStream, k == dlStreamSeq, k == dlDownstream:
		case strings.HasPrefix(k, "Nats-"):
		default:
			out[k] = v
		}
	}
	out.Set(shaper.KeyHeader, dl.Key)
	out.Set(shaper.ReplayOfHeader, strconv.FormatUint(dl.Seq, 10))
	out.Set(shaper.MsgIDHeader, fmt.Sprintf("replay/%s/%d", stream, dl.Seq))
	return &nats.Msg{Subject: subject, Header: out, Data: m.Data()}, nil
}
