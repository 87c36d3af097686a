package main

import (
	"context"
	"time"

	"go.uber.org/ratelimit"
	"golang.org/x/time/rate"

	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
)

// A taker releases one departure per call, blocking until the pacer allows
// it, and returns the instant of the departure (read after the pacer let it
// go, the way a caller would stamp the request it is about to send).
type taker interface {
	take() time.Time
	close()
}

// pacerKind is one contender of the precision and judge sections.
type pacerKind struct {
	name string
	// what says in a few words what the loop does.
	what string
	make func(perSecond float64) taker
}

// pacerKinds are the contenders, shaper's own first. The shaper rows run
// exactly the loop of drain/lane.go's departLoop, steps 3 and 4, under a
// permanent backlog (a message and a task slot are always ready).
func pacerKinds() []pacerKind {
	return []pacerKind{
		{"shaper", "shaper.Pacer + drain.NewPreciseWaiter() (timerfd in the poller, then spin)", func(r float64) taker {
			return newShaperTaker(r, &recWaiter{inner: drain.NewPreciseWaiter()})
		}},
		{"shaper min_spacing 1.0", "the same, configured for a strict judge (rate.min_spacing: 1.0: never early)", func(r float64) taker {
			t := newShaperTaker(r, &recWaiter{inner: drain.NewPreciseWaiter()})
			t.p = shaper.NewPacer(shaper.PacerConfig{Limit: shaper.Limit(r), MinSpacing: 1}, time.Now())
			return t
		}},
		{"shaper (TimerWaiter)", "the same pacer on drain.TimerWaiter{} (a plain time.Timer)", func(r float64) taker {
			return newShaperTaker(r, &recWaiter{inner: drain.TimerWaiter{}})
		}},
		{"x/time/rate", "rate.NewLimiter(r, 1).Wait(ctx)", func(r float64) taker {
			return &xrateTaker{lim: rate.NewLimiter(rate.Limit(r), 1), ctx: context.Background()}
		}},
		{"uber ratelimit", "ratelimit.New(r).Take() (default slack 10)", func(r float64) taker {
			return &uberTaker{rl: ratelimit.New(int(r))}
		}},
		{"uber WithoutSlack", "ratelimit.New(r, ratelimit.WithoutSlack).Take()", func(r float64) taker {
			return &uberTaker{rl: ratelimit.New(int(r), ratelimit.WithoutSlack)}
		}},
		{"time.Ticker", "<-time.NewTicker(1/r).C", func(r float64) taker {
			return &tickerTaker{t: time.NewTicker(time.Duration(float64(time.Second) / r))}
		}},
	}
}

// shaperTaker is drain/lane.go's departure loop without the bucket and the
// task slots: ready := now; loop { at := Next(now); if !at.After(now) break;
// Wait(at); now = time.Now() }; Depart(ready, now).
type shaperTaker struct {
	p      *shaper.Pacer
	w      drain.Waiter
	ctx    context.Context
	cancel context.CancelFunc
}

func newShaperTaker(perSecond float64, w drain.Waiter) *shaperTaker {
	// The lane's loop waits under a cancellable context (departStop), so
	// the waiter pays for registering the cancellation as it does there.
	ctx, cancel := context.WithCancel(context.Background())
	w.Bind()
	return &shaperTaker{
		p:   shaper.NewPacer(shaper.PacerConfig{Limit: shaper.Limit(perSecond)}, time.Now()),
		w:   w,
		ctx: ctx, cancel: cancel,
	}
}

func (s *shaperTaker) take() time.Time {
	ready := time.Now()
	now := ready
	for {
		at := s.p.Next(now)
		if !at.After(now) {
			break
		}
		if _, err := s.w.Wait(s.ctx, at, nil); err != nil {
			break
		}
		now = time.Now()
	}
	s.p.Depart(ready, now)
	return now
}

func (s *shaperTaker) close() {
	s.w.Unbind()
	s.cancel()
}

type xrateTaker struct {
	lim *rate.Limiter
	ctx context.Context
}

func (x *xrateTaker) take() time.Time {
	_ = x.lim.Wait(x.ctx)
	return time.Now()
}

func (x *xrateTaker) close() {}

type uberTaker struct{ rl ratelimit.Limiter }

func (u *uberTaker) take() time.Time {
	u.rl.Take()
	return time.Now()
}

func (u *uberTaker) close() {}

type tickerTaker struct{ t *time.Ticker }

func (k *tickerTaker) take() time.Time {
	<-k.t.C
	return time.Now()
}

func (k *tickerTaker) close() { k.t.Stop() }
