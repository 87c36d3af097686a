package redisslots

import (
	"context"
	"crypto/tls"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/shaper-dev/shaper/config"
	"github.com/shaper-dev/shaper/drain"
	"github.com/shaper-dev/shaper/shaper"
)

// The global schedule of a lane (SPEC §3 "Global rate", docs/scaling.md).
//
// All replicas serving a lane share one GCRA schedule kept in Redis: the
// theoretical time of the next departure slot (tat) and the end of a shared
// pause, both in microseconds of the Redis server's clock. One Lua script
// (gcraScript) reserves slots: it reads the server's TIME, places the
// reservation at max(tat, pause, now − slack×interval − lag), advances tat
// by k×interval and returns the first slot and the server's now. The client
// turns server times into local ones with the offset that round trips
// measure (the server's now against the local midpoint of the call; the
// least uncertain recent sample is kept, see clockSync), so the replicas'
// clocks may disagree by any amount: they never compare their own clocks
// with one another or with the server's.
//
// Leases. Above 500/s one round trip per departure is more than the Redis
// budget allows for no gain (NOTES.md: a round trip is ~60 µs, and the script
// costs what a PING costs), so a call reserves k consecutive slots, k =
// floor(2 ms / interval): a lease never spans more than ~2 ms. The slots of a
// lease are ordinary slots of the shared schedule (tat advances by
// k×interval), so departures across all replicas still follow one GCRA
// schedule. A slot that is not used in time is dropped, never given back
// later as a burst: a departure may leave at most shaper.SlotTolerance
// after its slot, which keeps SPEC G1's spacing and windows across the
// replicas (docs/scaling.md, "Guarantees and allowances"; the lane applies
// the same rule to the slot it holds). A slot dropped because its replica
// woke up to an interval late is made up: the next reserve carries the
// debt, and the script spaces the following slots closer until it is
// repaid, within shaper.MakeUpLag (docs/scaling.md, "Late wake-ups").
// The next lease is reserved in the background once half of the current
// one is handed out (maybeAhead), so the round trip overlaps the wait for
// the rest of it.

// gcraScript is the whole protocol with Redis; see its header.
//
//go:embed redisslots.lua
var gcraScript string

// Lease sizing: a lease covers at most leaseSpan of the schedule.
const leaseSpan = 2 * time.Millisecond

// ErrRedisReply is wrapped when Redis answers the script with something
// that is not a reservation (a bug, or a key of another type).
var ErrRedisReply = errors.New("sources: unexpected reply from the redis schedule script")

// RedisSlots is the Redis edge of global rates: one client shared by every
// global lane of the process. Create it with NewRedisSlots, get one
// schedule per lane with Lane, and Close it at shutdown. It is safe for
// concurrent use.
type RedisSlots struct {
	client  redis.UniversalClient
	script  *redis.Script
	prefix  string
	timeout time.Duration
	clock   func() time.Time
	log     *slog.Logger
}

// RedisOption configures RedisSlots.
type RedisOption interface{ apply(*RedisSlots) }

type redisOptionFunc func(*RedisSlots)

func (f redisOptionFunc) apply(r *RedisSlots) { f(r) }

// WithRedisClock sets the local clock (default time.Now). Tests use it to
// give a replica a skewed clock; the schedule does not depend on it.
func WithRedisClock(clock func() time.Time) RedisOption {
	return redisOptionFunc(func(r *RedisSlots) { r.clock = clock })
}

// WithRedisLogger sets the logger (default: discard).
func WithRedisLogger(log *slog.Logger) RedisOption {
	return redisOptionFunc(func(r *RedisSlots) { r.log = log })
}

// NewRedisSlots builds the client for cfg (config.Redis, validated): a
// plain client for one address, a Redis Cluster client for several (or
// cfg.Cluster), a Sentinel client with cfg.MasterName — go-redis's
// UniversalClient rules. It does not connect; call Load to check the
// connection and load the script. Every call to Redis is bounded by
// cfg.Timeout (dial included) and never retried: a failure is reported at
// once, and the lane falls back to local pacing.
func NewRedisSlots(cfg config.Redis, opts ...RedisOption) (*RedisSlots, error) {
	uo, err := universalOptions(cfg)
	if err != nil {
		return nil, err
	}
	r := &RedisSlots{
		client:  redis.NewUniversalClient(uo),
		script:  redis.NewScript(gcraScript),
		prefix:  cfg.KeyPrefix,
		timeout: cfg.Timeout,
		clock:   time.Now,
		log:     slog.New(slog.DiscardHandler),
	}
	if r.prefix == "" {
		r.prefix = config.DefaultRedisKeyPrefix
	}
	if r.timeout <= 0 {
		r.timeout = config.DefaultRedisTimeout
	}
	for _, o := range opts {
		o.apply(r)
	}
	// go-redis logs every failed dial; the lane logs the transition to
	// and from the fallback once, so its lines go to debug.
	setRedisLogger.Do(func() { redis.SetLogger(redisLog{r.log}) })
	return r, nil
}

var setRedisLogger sync.Once

// redisLog sends go-redis's own log lines to slog at debug level.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis client: "+fmt.Sprintf(format, v...))
}

// universalOptions maps the redis section to go-redis options. Addresses
// may be host:port or redis:// / rediss:// URLs; the user, password,
// database and TLS of a URL apply unless the section sets them.
func universalOptions(cfg config.Redis) (*redis.UniversalOptions, error) {
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = config.DefaultRedisTimeout
	}
	uo := &redis.UniversalOptions{
		Username:      cfg.Username,
		Password:      cfg.Password,
		DB:            cfg.DB,
		MasterName:    cfg.MasterName,
		IsClusterMode: cfg.Cluster,
		// One attempt per call, bounded by the timeout: a retried
		// reservation would only take slots nobody uses, and a slow
		// Redis must turn into the local fallback quickly.
		// Each call's own deadline is its context's (runAll: the timeout,
		// or retryTimeouts × it for the retry); the socket deadlines only
		// bound calls made without one (go-redis takes the earlier of the
		// two), so they allow the retry's.
		MaxRetries:            -1,
		DialerRetries:         1,
		DialTimeout:           timeout,
		ReadTimeout:           retryTimeouts * timeout,
		WriteTimeout:          retryTimeouts * timeout,
		PoolTimeout:           timeout,
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	useTLS := cfg.TLS
	for _, a := range strings.Split(cfg.Addr, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if !strings.Contains(a, "://") {
			uo.Addrs = append(uo.Addrs, a)
			continue
		}
		u, err := url.Parse(a)
		if err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
			return nil, fmt.Errorf("redis.addr: an item is not a redis:// or rediss:// URL")
		}
		uo.Addrs = append(uo.Addrs, u.Host)
		useTLS = useTLS || u.Scheme == "rediss"
		if u.User != nil {
			if uo.Username == "" {
				uo.Username = u.User.Username()
			}
			if pw, ok := u.User.Password(); ok && uo.Password == "" {
				uo.Password = pw
			}
		}
		if db := strings.Trim(u.Path, "/"); db != "" && uo.DB == 0 {
			n, err := strconv.Atoi(db)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("redis.addr: the path of a URL must be a database number")
			}
			uo.DB = n
		}
	}
	if len(uo.Addrs) == 0 {
		return nil, errors.New("redis.addr: no address")
	}
	if useTLS {
		uo.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return uo, nil
}

// Load checks that Redis answers and loads the script (SCRIPT LOAD, on
// every master of a cluster), so that reservations run with EVALSHA. A
// script flushed later (SCRIPT FLUSH, a restart, a failover) is loaded
// again on the NOSCRIPT reply, transparently. ctx bounds the whole check.
func (r *RedisSlots) Load(ctx context.Context) error {
	if err := r.script.Load(ctx, r.client).Err(); err != nil {
		return fmt.Errorf("redis: load the schedule script: %w", err)
	}
	return nil
}

// Close closes the connections.
func (r *RedisSlots) Close() error { return r.client.Close() }

// Key returns the Redis key of lane's schedule: "{<prefix>:<lane>}:schedule".
// The braces are a hash tag, so that every key of a lane lives in one slot
// of a Redis Cluster (SPEC case C26: a script whose keys span slots fails
// with CROSSSLOT).
func (r *RedisSlots) Key(lane string) string {
	return "{" + r.prefix + ":" + lane + "}:schedule"
}

// QuotaKey returns the Redis key of lane's shared quota (rate.quota with
// rate.global): "{<prefix>:<lane>}:quota", a list of the instants of the
// newest count slots granted, in the hash slot of Key(lane).
func (r *RedisSlots) QuotaKey(lane string) string {
	return "{" + r.prefix + ":" + lane + "}:quota"
}

// Lane returns the shared schedule of lane. It implements
// drain.GlobalSchedule and drain.QuotaReporter.
func (r *RedisSlots) Lane(lane string) *LaneSlots {
	ls := &LaneSlots{r: r, key: r.Key(lane), qkey: r.QuotaKey(lane)}
	ls.remaining.Store(-1)
	return ls
}

// LaneSlots is one lane's view of its shared schedule: it reserves leases
// and hands their slots out one departure at a time. It is safe for
// concurrent use, but one departure loop is expected to call Reserve.
type LaneSlots struct {
	r    *RedisSlots
	key  string
	qkey string // the shared quota's list

	mu    sync.Mutex
	lease lease
	sync  clockSync
	// ahead is closed when the answer to the reservation made ahead (once
	// half of the current lease was handed out: maybeAhead) is in
	// aheadCall; nil when none is pending or waiting to be used. The
	// goroutine that makes it writes aheadCall without s.mu and closes
	// ahead; only the holder of s.mu that received from ahead reads it.
	ahead     chan struct{}
	aheadCall reserveCall
	// aheadWant says the lease reserved ahead is due (maybeAhead), under
	// aheadReq, and waits for PrefetchSlots to start it.
	aheadWant bool
	aheadReq  drain.SlotRequest
	pausedTo  time.Time // the latest shared pause this replica set (Pause)
	// owed is the make-up this replica owes the schedule for the slots it
	// dropped since its last reserve because it woke too late for them
	// (Release, dropStale): sent with the next reserve, which repays it by
	// spacing the following slots closer (redisslots.lua, ARGV[9]).
	owed time.Duration
	// owedComp is the schedule's comp at the earliest slot owed is for.
	owedComp float64
	// handed is the last slot Reserve handed out, at the schedule's comp
	// handedComp: the slot the lane holds, which it may Release.
	handed     time.Time
	handedComp float64

	// dropped counts the slots dropped because their departure came too
	// late (a stale slot of the lease, or the handed slot released), and
	// droppedLate sums their lateness (Dropped).
	dropped     int64
	droppedLate time.Duration
	onDrop      func(n int) // OnDrop's; nil until set

	// answered: Redis answered this lane at least once; down: the last
	// call failed, Redis being unreachable (the lane paces locally), until
	// a reservation or a Probe is answered. While down, a reservation is
	// not retried (retryOnce) and a refused one is not waited for
	// (awaitRestart): the lane's probes must not hold its local pace.
	answered, down bool

	calls atomic.Int64 // round trips (script runs), for benchmarks
	// remaining is the shared quota's remainder at the last answer that
	// carried one; -1 before it.
	remaining atomic.Int64
}

// QuotaRemaining returns what the shared quota allowed in its window at
// Redis's last answer, in messages, counting the slots of every replica;
// -1 before an answer with a quota (drain.QuotaReporter).
func (s *LaneSlots) QuotaRemaining() int { return int(s.remaining.Load()) }

// quotaGap is the least distance, on the schedule, between a slot and the
// slot count grants after it: the window per, plus shaper.QuotaMargin (the
// departure's way to the wire, as for the local quota), plus the
// tolerance by which a departure may use its slot late (SlotTolerance), so
// that departures i and i + count, not only their slots, are more than per
// + QuotaMargin apart.
func quotaGap(r drain.SlotRequest) time.Duration {
	return r.QuotaPer + shaper.QuotaMargin + shaper.SlotTolerance(r.Interval, r.Slack, r.MinSpacing)
}

// lease is a run of n consecutive slots starting at first (local time),
// interval apart, of which next is the first not handed out.
type lease struct {
	first    time.Time
	interval time.Duration
	n, next  int
	// comp is the schedule's make-up repaid so far at the first slot, and
	// repay what each slot after it adds, microseconds (redisslots.lua).
	comp, repay float64
}

// compAt is the schedule's comp at slot i of the lease.
func (l *lease) compAt(i int) float64 { return l.comp + float64(i)*l.repay }

func (l *lease) slot(i int) time.Time { return l.first.Add(time.Duration(i) * l.interval) }

// dropStale skips the slots older than tol at now, and returns the make-up
// they are owed (lateMakeUp).
func (l *lease) dropStale(now time.Time, tol time.Duration) (owed time.Duration, comp float64) {
	for l.next < l.n && now.Sub(l.slot(l.next)) > tol {
		if m := lateMakeUp(now.Sub(l.slot(l.next)), l.interval, tol); m > 0 {
			if owed == 0 {
				comp = l.compAt(l.next)
			}
			owed += m
		}
		l.next++
	}
	return owed, comp
}

// dropStale drops the lease's slots older than tol, counts them (Dropped)
// and owes their make-up; s.mu is held.
func (s *LaneSlots) dropStale(tol time.Duration) {
	now := s.r.clock()
	first := s.lease.next
	s.owe(s.lease.dropStale(now, tol))
	for i := first; i < s.lease.next; i++ {
		s.dropped++
		s.droppedLate += now.Sub(s.lease.slot(i))
	}
	if n := s.lease.next - first; n > 0 && s.onDrop != nil {
		s.onDrop(n)
	}
}

// OnDrop sets the function called with the number of slots this replica's
// schedule drops of its own (drain.DropNotifier: the lane's
// shaper_global_slots_dropped_total): the stale slots of a lease, current or
// fresh. A held slot the lane releases (Release) the lane counts itself.
// f is called under the schedule's lock.
func (s *LaneSlots) OnDrop(f func(n int)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.onDrop = f
}

// Dropped returns how many slots this replica dropped because its
// departure came later than shaper.SlotTolerance after them, and their mean
// lateness (benchmarks: what a shortfall of the shared rate is made of).
func (s *LaneSlots) Dropped() (n int64, meanLate time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dropped == 0 {
		return 0, 0
	}
	return s.dropped, s.droppedLate / time.Duration(s.dropped)
}

// owe adds the make-up m for dropped slots, the earliest of them at the
// schedule's comp, to what is sent with the next reserve; s.mu is held.
func (s *LaneSlots) owe(m time.Duration, comp float64) {
	if m <= 0 {
		return
	}
	if s.owed == 0 || comp < s.owedComp {
		s.owedComp = comp
	}
	s.owed += m
}

// lateMakeUp is the make-up owed to the schedule for one slot of the
// schedule at interval iv, dropped because its departure came late after
// it (beyond the tolerance tol): the slot's interval, when the lateness is
// within one interval past the tolerance — a waiter that woke late, a
// short stall (SPEC G1: a waiter that wakes late must not cost rate) —
// and nothing for a later one (a pause, a stall), which a lane's own
// pacer forgives too (shaper.MakeUpLag). The schedule caps what it is
// owed below one interval.
func lateMakeUp(late, iv, tol time.Duration) time.Duration {
	if late <= tol || late > tol+iv {
		return 0
	}
	return iv
}

// leaseSize is k, the number of slots a call reserves at interval.
func leaseSize(interval time.Duration) int {
	if interval <= 0 {
		return 1
	}
	return max(1, int(leaseSpan/interval))
}

// Reserve takes the next slot of the lane's shared schedule for one
// departure at r.Interval (the lane's current emission interval) within the
// shared quota r.QuotaCount per r.QuotaPer, when set, and returns
// the local time at which the departure may leave; it may be in the past by
// up to shaper.SlotTolerance (slack + 1 − min_spacing intervals): a slot
// older than that is dropped, so that the departures of all replicas keep
// SPEC G1's windows and spacing. It calls Redis when the current lease
// is used up (and, for leases of several slots, in the background once
// half of the lease is handed out, to reserve the next lease ahead:
// maybeAhead). An error means Redis failed or
// did not answer within the timeout: no slot is given, the caller paces
// locally. A call that times out, or whose connection broke, is tried once
// more, with retryTimeouts × the timeout, before Reserve gives up
// (retryOnce), so Reserve returns within about seven times the timeout. A
// refused connection after an answer is waited for up to restartWait
// (awaitRestart: a restarting server). While the last call failed (the
// lane paces locally) neither is done: a failure returns at once. When the
// shared quota is spent the error is a *drain.QuotaWait with the local
// instant at which the oldest counted slot leaves the window: no slot was
// taken, ask again then. A lease is cut short where the quota would be
// spent within it.
func (s *LaneSlots) Reserve(ctx context.Context, r drain.SlotRequest) (time.Time, error) {
	interval := r.Interval
	if interval <= 0 {
		return time.Time{}, fmt.Errorf("redis schedule %s: interval %v must be > 0", s.key, interval)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	tol := shaper.SlotTolerance(interval, r.Slack, r.MinSpacing)
	s.dropStale(tol)
	if s.lease.next >= s.lease.n && s.ahead != nil {
		if err := s.adoptAhead(ctx); err != nil {
			return time.Time{}, err // the shared quota is spent, or ctx ended
		}
		s.dropStale(tol)
	}
	if s.lease.next < s.lease.n {
		return s.handOut(ctx, r), nil
	}
	next, err := s.reserveRetrying(ctx, r)
	if err != nil && ctx.Err() == nil && refused(err) && s.answered && !s.down {
		// Redis restarting: refused for tens of ms (retry.go).
		next, err = s.awaitRestart(ctx, r, err)
	}
	s.setDown(ctx, err)
	if err != nil {
		return time.Time{}, err
	}
	s.lease = next
	s.aheadWant = false // due, if at all, within this lease
	// A fresh lease is the schedule's own answer at this moment: when even
	// its last slot looks stale (a round trip slower than the lag allows),
	// that slot is still used rather than none (and is owed nothing: the
	// caller that finds it too late tells Release).
	now := s.r.clock()
	owed, comp := s.lease.dropStale(now, tol)
	if s.lease.next >= s.lease.n {
		s.lease.next = s.lease.n - 1
		owed -= lateMakeUp(now.Sub(s.lease.slot(s.lease.next)), s.lease.interval, tol)
	}
	s.owe(owed, comp)
	if skipped := s.lease.next; skipped > 0 { // dropped too (Dropped, OnDrop)
		for i := range skipped {
			s.dropped++
			s.droppedLate += now.Sub(s.lease.slot(i))
		}
		if s.onDrop != nil {
			s.onDrop(skipped)
		}
	}
	return s.handOut(ctx, r), nil
}

// handOut hands out the lease's next slot, remembering it for Release;
// s.mu is held.
func (s *LaneSlots) handOut(ctx context.Context, r drain.SlotRequest) time.Time {
	t := s.lease.slot(s.lease.next)
	s.handed, s.handedComp = t, s.lease.compAt(s.lease.next)
	s.lease.next++
	s.maybeAhead(ctx, r)
	return t
}

// maybeAhead has the next lease reserved in the background once half of the
// current one (of several slots) is handed out; s.mu is held. The round
// trip then overlaps the wait for the rest of the lease instead of
// delaying a departure. It starts at the caller's next PrefetchSlots,
// after the departure of the slot just handed out (a goroutine's start
// costs the caller up to 220 µs here: drain.SlotPrefetcher), or at once
// when the last slot is handed out before that (a caller that does not
// prefetch). Made in line as the last slot was handed out (the
// code before), it left too little of that slot's tolerance: at 1,000/s,
// leases of two, one slot in two was dropped as stale and the replicas
// reached 468–516/s (bench section 6); and a lease reserved only at its
// predecessor's last slot arrives after its own first slot once a round
// trip is as long as an interval (TestRedisLastSlotNotStale). A replica
// holds at most two leases (4 ms of the schedule): slots it leaves unused
// at a pause or a stop are lost, never given back as a burst.
func (s *LaneSlots) maybeAhead(ctx context.Context, r drain.SlotRequest) {
	// A lease exists only once reserve synced the clock: the reservation
	// ahead needs no samples of its own.
	if s.lease.n > 1 && s.ahead == nil && s.lease.n-s.lease.next <= s.lease.n/2 {
		s.aheadWant, s.aheadReq = true, r
		if s.lease.next >= s.lease.n {
			s.startAhead(ctx, r)
		}
	}
}

// PrefetchSlots starts the reservation of the next lease when it is due
// (maybeAhead), in the background (drain.SlotPrefetcher). It does not
// block on Redis.
func (s *LaneSlots) PrefetchSlots(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aheadWant && s.ahead == nil {
		s.startAhead(ctx, s.aheadReq)
	}
}

// startAhead reserves the next lease under r in a goroutine of its own;
// s.mu is held. The reservation's arguments are made here, under the
// caller's lock, and its answer is read into a lease by adoptAhead, under
// Reserve's: the goroutine never takes s.mu, so a departure's Reserve never
// waits for it to lock before or after its round trip (a goroutine parked
// on a mutex wakes late on a VM whose idle cores wake slowly). The call is
// not cancelled with ctx (its own timeout bounds it), so that a lease
// Redis granted is not lost on the way.
func (s *LaneSlots) startAhead(ctx context.Context, r drain.SlotRequest) {
	s.aheadWant = false
	done := make(chan struct{})
	s.ahead = done
	call := s.prepareReserve(r)
	ctx = context.WithoutCancel(ctx)
	go func() {
		call.reply, call.res, call.t0, call.t1, call.err = s.runAll(ctx, "reserve", call.args...)
		s.aheadCall = call
		close(done)
	}()
}

// adoptAhead waits for the lease reserved ahead and makes it the current
// lease, without the slots inside a pause this replica set since; s.mu is
// held, and released while it waits. It returns the reservation's
// *drain.QuotaWait, or ctx's error when ctx ended first (the lease stays
// pending). A failed reservation leaves the current lease empty, for
// Reserve to call Redis again now.
func (s *LaneSlots) adoptAhead(ctx context.Context) error {
	done := s.ahead
	select {
	case <-done:
	default:
		s.mu.Unlock()
		select {
		case <-done:
		case <-ctx.Done():
		}
		s.mu.Lock()
		select {
		case <-done:
		default:
			return ctx.Err()
		}
	}
	s.ahead = nil
	call := s.aheadCall
	s.aheadCall = reserveCall{}
	l, err := s.finishReserve(call)
	if err != nil {
		if _, spent := errors.AsType[*drain.QuotaWait](err); spent {
			return err
		}
		return nil
	}
	for l.next < l.n && l.slot(l.next).Before(s.pausedTo) {
		l.next++
	}
	s.lease = l
	return nil
}

// isTimeout reports whether err is a call that ran out of time (as opposed
// to a refused or broken connection, or an error reply).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// reserveCall is one reservation's call: the arguments made for it
// (prepareReserve) and the script's answer (runAll), which finishReserve
// reads into a lease.
type reserveCall struct {
	r    drain.SlotRequest
	args []string
	// The answer: its two leading numbers, the whole of it, the local
	// instants around the round trip, and the call's error.
	reply  [2]float64
	res    []string
	t0, t1 time.Time
	err    error
}

// reserve runs the script for a lease of leaseSize(interval) slots; s.mu
// is held.
func (s *LaneSlots) reserve(ctx context.Context, r drain.SlotRequest) (lease, error) {
	if !s.sync.set {
		// A first round trip is often lopsided (lazy set-up on the way
		// out): anchor the clock on a few samples before the first lease.
		for range syncSamples {
			reply, _, t0, t1, err := s.runAll(ctx, "time")
			if err != nil {
				return lease{}, err
			}
			s.sync.observe(t0, t1, reply[1])
		}
	}
	call := s.prepareReserve(r)
	call.reply, call.res, call.t0, call.t1, call.err = s.runAll(ctx, "reserve", call.args...)
	return s.finishReserve(call)
}

// reserveRetrying reserves, and tries once more (retryOnce, retry.go) when
// the call timed out or its connection broke, unless the last call failed
// (s.down: the lane paces locally, and its probes must not hold it). One
// late answer (a stall of this process or of Redis), or a connection a
// failover broke, is not an outage: falling back while the other replicas
// still reach Redis would add this replica's fallback rate on top of the
// limit. The retry gets a longer deadline (retryTimeouts: a failover's
// pause of the old master's clients). s.mu is held.
func (s *LaneSlots) reserveRetrying(ctx context.Context, r drain.SlotRequest) (lease, error) {
	next, err := s.reserve(ctx, r)
	if err != nil && ctx.Err() == nil && retryOnce(err) && !s.down {
		next, err = s.reserve(asRetry(ctx), r)
	}
	return next, err
}

// prepareReserve makes the arguments of a reservation under r, and takes
// the make-up owed into them; s.mu is held.
func (s *LaneSlots) prepareReserve(r drain.SlotRequest) reserveCall {
	interval := r.Interval
	k := leaseSize(interval)
	us := func(d time.Duration) string {
		return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 3, 64)
	}
	args := []string{us(interval),
		strconv.Itoa(k),
		strconv.Itoa(max(0, r.Slack)),
		// The make-up of a late request (shaper.SlotMakeUp), not on top of
		// the slack: an idle schedule grants 1 + slack.
		us(shaper.SlotMakeUp(interval, r.MinSpacing))}
	quota := hasQuota(r)
	if quota {
		args = append(args, strconv.Itoa(r.QuotaCount), us(r.QuotaPer), us(quotaGap(r)))
	} else {
		args = append(args, "0", "0", "0")
	}
	// The make-up owed for slots dropped late, repaid by the schedule up
	// to what a lane's own pacer makes up (shaper.MakeUpLag, under one
	// interval, so that every window keeps SPEC G1's bound).
	owed, owedComp := s.owed, s.owedComp
	s.owed, s.owedComp = 0, 0
	if quota {
		// No make-up under a shared quota: each window's grants replay
		// the last window's, so a compressed stretch came back as a wait
		// in the next window (TestGlobalQuotaTwoReplicas: 8 waits a
		// replica instead of 4, in 1 run of 5); a dropped slot gives its
		// quota back instead (Release).
		owed = 0
	}
	args = append(args, us(owed), us(shaper.MakeUpLag(interval, max(0, r.Slack), r.MinSpacing)),
		strconv.FormatFloat(owedComp, 'f', 3, 64),
		// Repaid no faster than the lane's own pacer can follow.
		us(shaper.SlotRepayMax(interval, max(0, r.Slack), r.MinSpacing)))
	return reserveCall{r: r, args: args}
}

// hasQuota reports whether r asks within a shared quota.
func hasQuota(r drain.SlotRequest) bool { return r.QuotaCount > 0 && r.QuotaPer > 0 }

// finishReserve reads the answer of call into a lease, or the error; s.mu
// is held.
func (s *LaneSlots) finishReserve(call reserveCall) (lease, error) {
	if call.err != nil {
		return lease{}, call.err
	}
	interval, res := call.r.Interval, call.res
	k, quota := leaseSize(interval), hasQuota(call.r)
	start, now := call.reply[0], call.reply[1]
	s.sync.observe(call.t0, call.t1, now)
	spacing, comp, repay := interval, 0.0, 0.0
	if len(res) >= 7 {
		ivUS := float64(interval) / float64(time.Microsecond)
		sp, perr := strconv.ParseFloat(res[5], 64)
		c, cerr := strconv.ParseFloat(res[6], 64)
		if perr != nil || cerr != nil || !(sp > 0) || sp > ivUS+1 || math.IsNaN(c) || math.IsInf(c, 0) {
			return lease{}, fmt.Errorf("redis schedule %s: reserve: %w: %q", s.key, ErrRedisReply, res)
		}
		spacing, comp, repay = time.Duration(sp*float64(time.Microsecond)), c, max(0, ivUS-sp)
	}
	n := k
	if quota {
		granted, remaining, perr := quotaReply(res)
		if perr != nil {
			return lease{}, fmt.Errorf("redis schedule %s: reserve: %w: %q", s.key, ErrRedisReply, res)
		}
		s.remaining.Store(int64(remaining))
		if granted == 0 {
			return lease{}, &drain.QuotaWait{Until: s.sync.local(start)}
		}
		n = min(granted, k)
	}
	return lease{first: s.sync.local(start), interval: spacing, n: n, comp: comp, repay: repay}, nil
}

// quotaReply reads the granted count and the quota's remainder (the 4th
// and 5th items) of a reserve answer.
func quotaReply(res []string) (granted, remaining int, err error) {
	if len(res) < 5 {
		return 0, 0, ErrRedisReply
	}
	if granted, err = strconv.Atoi(res[3]); err != nil || granted < 0 {
		return 0, 0, ErrRedisReply
	}
	if remaining, err = strconv.Atoi(res[4]); err != nil {
		return 0, 0, ErrRedisReply
	}
	return granted, remaining, nil
}

// Release tells the schedule that the slot at slot (local time), which
// Reserve gave under r, was dropped unused (drain.SlotReleaser): the lane
// woke later than shaper.SlotTolerance after it. When it was late by at
// most one interval past the tolerance (a waiter that woke late, a short
// stall: lateMakeUp), the slot's interval is owed to the schedule and sent
// with the next reserve, which makes it up by spacing the following slots
// closer, never in a burst (redisslots.lua, ARGV[9]); that costs no round
// trip. With a shared quota, its grant is also taken out of the quota list
// (a round trip), so that a replica that woke too late for its slot does
// not spend the quota on a departure that never happened. An error means
// Redis failed; the grant then still counts.
func (s *LaneSlots) Release(ctx context.Context, slot time.Time, r drain.SlotRequest) error {
	s.mu.Lock()
	if r.Interval > 0 {
		if slot.Equal(s.handed) { // else not the slot it holds: nothing is known of it
			late := s.r.clock().Sub(slot)
			s.owe(lateMakeUp(late, r.Interval, shaper.SlotTolerance(r.Interval, r.Slack, r.MinSpacing)), s.handedComp)
			s.dropped++
			s.droppedLate += late
		}
	}
	set := s.sync.set
	server := s.sync.serverMicros(slot)
	s.mu.Unlock()
	if !hasQuota(r) || !set {
		return nil
	}
	tol := float64(r.Interval) / float64(time.Microsecond) / 2
	_, _, _, err := s.run(ctx, "release", strconv.FormatFloat(server, 'f', 3, 64), strconv.FormatFloat(tol, 'f', 3, 64))
	return err
}

// Shift tells the schedule that the request of the slot at slot (local
// time), which Reserve gave, reached the wire by later than the schedule
// allows (drain.ScheduleShifter): the slots not granted yet move later by
// by, so that no window of the downstream gets one more than SPEC G1 allows
// from the late request and the slots after it (docs/scaling.md, "Late
// writes"). It costs the rate by, never a burst. An error means Redis
// failed; the schedule then stays as it was.
func (s *LaneSlots) Shift(ctx context.Context, slot time.Time, by time.Duration) error {
	if by <= 0 {
		return nil
	}
	s.mu.Lock()
	set := s.sync.set
	server := s.sync.serverMicros(slot)
	s.mu.Unlock()
	if !set {
		return nil
	}
	_, _, _, err := s.run(ctx, "shift", strconv.FormatFloat(server, 'f', 3, 64),
		strconv.FormatFloat(float64(by)/float64(time.Microsecond), 'f', 3, 64))
	return err
}

// Probe asks Redis whether the lane's schedule answers (drain.GlobalSchedule):
// one run of the script's "time" operation on the lane's key, so it reaches
// the node that holds the key and reloads the script after a restart; it
// takes no slot. Once the clock is synced, the answer refines it. An error means
// Redis failed or did not answer within the timeout.
func (s *LaneSlots) Probe(ctx context.Context) error {
	reply, t0, t1, err := s.run(ctx, "time")
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.sync.set { // the first lease anchors on samples of its own (reserve)
		s.sync.observe(t0, t1, reply[1])
	}
	s.answered, s.down = true, false
	s.mu.Unlock()
	return nil
}

// Pause extends the shared pause of the lane until until (local time): no
// replica gets a slot before it. A pause that ends earlier than one already
// set changes nothing.
func (s *LaneSlots) Pause(ctx context.Context, until time.Time) error {
	d := until.Sub(s.r.clock())
	if d <= 0 {
		return nil
	}
	_, _, _, err := s.run(ctx, "pause", strconv.FormatInt(int64(math.Ceil(float64(d)/float64(time.Microsecond))), 10))
	if err != nil {
		return err
	}
	s.mu.Lock()
	// Slots of the current lease inside the pause must not be used, nor
	// those of a lease reserved ahead (adoptAhead).
	for s.lease.next < s.lease.n && s.lease.slot(s.lease.next).Before(until) {
		s.lease.next++
	}
	if until.After(s.pausedTo) {
		s.pausedTo = until
	}
	s.mu.Unlock()
	return nil
}

// run calls the script under the timeout and returns its two leading
// numbers (microseconds of the server clock) and the local instants just
// before and after the call.
func (s *LaneSlots) run(ctx context.Context, op string, args ...string) (out [2]float64, t0, t1 time.Time, err error) {
	out, _, t0, t1, err = s.runAll(ctx, op, args...)
	return out, t0, t1, err
}

// runAll is run that also returns the whole answer.
func (s *LaneSlots) runAll(ctx context.Context, op string, args ...string) (out [2]float64, res []string, t0, t1 time.Time, err error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout(ctx, s.r.timeout))
	defer cancel()
	argv := make([]any, 0, len(args)+1)
	argv = append(argv, op)
	for _, a := range args {
		argv = append(argv, a)
	}
	t0 = s.r.clock()
	res, err = s.r.script.Run(ctx, s.r.client, []string{s.key, s.qkey}, argv...).StringSlice()
	t1 = s.r.clock()
	s.calls.Add(1)
	if err != nil {
		return out, res, t0, t1, fmt.Errorf("redis schedule %s: %s: %w", s.key, op, err)
	}
	if len(res) < 2 {
		return out, res, t0, t1, fmt.Errorf("redis schedule %s: %s: %w: %q", s.key, op, ErrRedisReply, res)
	}
	for i := range out {
		v, perr := strconv.ParseFloat(res[i], 64)
		if perr != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return out, res, t0, t1, fmt.Errorf("redis schedule %s: %s: %w: %q", s.key, op, ErrRedisReply, res)
		}
		out[i] = v
	}
	return out, res, t0, t1, nil
}

// syncSamples is the number of clock samples taken before a lane's first
// lease.
const syncSamples = 3

// maxDrift bounds how fast the local and the server clocks may drift
// apart (100 ppm, far more than real quartz and NTP-disciplined clocks).
const maxDrift = 100e-6

// clockSync converts the server's clock to the local one. Each round trip
// is a sample: the server's now lies within half the round trip of the
// local midpoint. The conversion uses the sample with the least
// uncertainty — its half round trip, grown by the drift since — rather
// than the latest one, because a round trip stretched by the scheduler (a
// stalled goroutine, a busy core) would shift a whole lease by up to half
// of it. A sample that contradicts the anchor beyond both uncertainties
// (the server's clock was stepped, or a failover moved the key to a server
// with another clock) replaces it at once.
type clockSync struct {
	set    bool
	mid    time.Time     // local midpoint of the anchor's round trip
	server float64       // the server's now in that round trip, µs
	half   time.Duration // half the anchor's round trip
}

func (c *clockSync) uncertainty(at time.Time) time.Duration {
	return c.half + time.Duration(maxDrift*math.Abs(float64(at.Sub(c.mid))))
}

// local converts a server time (µs) to a local one.
// serverMicros is the server's clock, in microseconds, at the local instant
// t: the inverse of local.
func (c *clockSync) serverMicros(t time.Time) float64 {
	return c.server + float64(t.Sub(c.mid))/float64(time.Microsecond)
}

func (c *clockSync) local(server float64) time.Time {
	return c.mid.Add(time.Duration((server - c.server) * float64(time.Microsecond)))
}

// observe takes the sample of a round trip from t0 to t1 in which the
// server's clock read server.
func (c *clockSync) observe(t0, t1 time.Time, server float64) {
	half := t1.Sub(t0) / 2
	mid := t0.Add(half)
	if c.set {
		u := c.uncertainty(mid)
		off := c.local(server).Sub(mid)
		if half > u && off.Abs() <= u+half {
			return // consistent, and the anchor is more precise
		}
	}
	*c = clockSync{set: true, mid: mid, server: server, half: half}
}
