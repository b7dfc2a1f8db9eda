package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
)

// Defaults of BatchConfig.
const (
	DefaultMaxBatch = 64
	DefaultMaxWait  = 50 * time.Microsecond
)

// BatchConfig configures a Batcher. The zero value of each field takes its default.
type BatchConfig struct {
	// MaxBatch is the most requests sent in one batch (default 64). A queue that
	// reaches it goes out at once, even while another batch is in flight. 1 turns
	// batching off: every request is its own EVALSHA, as with Store.Decide.
	MaxBatch int
	// MaxWait bounds how long a queued request waits for the round trip in flight
	// ahead of it before its queue goes out as a batch of its own (default 50µs). A
	// request that finds nothing in flight never waits.
	MaxWait time.Duration
}

// A Batcher decides requests on a Store, sending the requests that arrive while others
// are in flight to Redis together. A lone request goes out at once; only when a round
// trip is already under way do arriving requests queue, and the queue goes out when
// that round trip ends, when it holds MaxBatch requests, or after MaxWait, whichever
// comes first. On a standalone Redis a batch is one EVALSHA of the many-request script
// (algo.DecideManyScript); on a cluster it is one pipeline per node of one EVALSHA per
// request. Either way each request is decided all-or-nothing on its own, with its own
// reply or error; only the round trip is shared. A request whose keys span several
// cluster slots bypasses the batcher and takes Store.Decide (with its refunds).
//
// A standalone endpoint that is really a sharding proxy (twemproxy, Envoy's Redis
// proxy) cannot run one script over several clients' keys: do not batch behind one.
//
// Batcher implements the engine's Store interface. It is safe for simultaneous use
// and starts no goroutine of its own while idle.
type Batcher struct {
	store    *Store
	maxBatch int
	maxWait  time.Duration
	args     argCache
	calls    sync.Pool

	mu       sync.Mutex
	queue    []*call
	inflight int // round trips (lone or pipelined) under way
	timer    *time.Timer
}

// call is one queued request.
type call struct {
	check    algo.Check
	node     string             // the node that holds its keys
	deadline time.Time          // zero: none
	args     []any              // the EVALSHA command, reused between calls
	cmd      *redis.IntSliceCmd // the EVALSHA in a pipeline
	eval     *redis.Cmd         // the EVAL that replaced it after a NOSCRIPT
	out      algo.Outcome
	err      error
	done     chan struct{} // receives once the outcome is set
	given    atomic.Bool   // the waiter gave up (its context ended) after the call was taken
}

// NewBatcher returns a batcher on store.
func NewBatcher(store *Store, cfg BatchConfig) (*Batcher, error) {
	if store == nil {
		return nil, errors.New("redisstore: nil store")
	}
	if cfg.MaxBatch < 0 || cfg.MaxWait < 0 {
		return nil, fmt.Errorf("redisstore: batch config %+v: MaxBatch and MaxWait must not be negative", cfg)
	}
	b := &Batcher{
		store:    store,
		maxBatch: def(cfg.MaxBatch, DefaultMaxBatch),
		maxWait:  def(cfg.MaxWait, DefaultMaxWait),
	}
	b.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	b.timer = time.AfterFunc(time.Hour, b.expire)
	b.timer.Stop()
	return b, nil
}

// Store returns the store the batcher decides on.
func (b *Batcher) Store() *Store { return b.store }

// UseBreakers replaces the store's node breakers (Store.UseBreakers).
func (b *Batcher) UseBreakers(st breaker.Settings) { b.store.UseBreakers(st) }

// Breakers returns the state of the store's node breakers (Store.Breakers).
func (b *Batcher) Breakers() []breaker.Status { return b.store.Breakers() }

// Health checks the store's nodes (Store.Health).
func (b *Batcher) Health(ctx context.Context) []breaker.Status { return b.store.Health(ctx) }

// Decide decides every meter of c together, as Store.Decide does, sharing the round
// trip with the requests in flight at the same time. It returns when the outcome is
// known or ctx ends, whichever comes first; a request whose context ends after it was
// sent may still have been charged, as with any command that times out. c must not be
// modified until Decide returns.
//
// A request goes to its node through the node's circuit breaker, as with
// Store.Decide: a request for a node whose breaker is open fails at once.
func (b *Batcher) Decide(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	c = c.AtWindows(nowOr(c.NowMicros))
	if len(c.Keys) != len(c.Meters) || len(c.Meters) == 0 || (b.store.cluster && !oneSlot(c.Keys)) {
		return b.store.Decide(ctx, c)
	}
	node, err := b.store.nodeOf(ctx, c.Keys[0])
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	p, err := b.store.allow(node)
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	out, err := b.decide(ctx, c, node)
	b.store.done(p, err)
	return out, err
}

// decide is Decide for a request on node, let through by its breaker.
func (b *Batcher) decide(ctx context.Context, c algo.Check, node string) (algo.Outcome, error) {
	if b.maxBatch == 1 {
		return b.lone(ctx, c)
	}
	b.mu.Lock()
	if b.inflight == 0 && len(b.queue) == 0 {
		// Nothing in flight: go now, without waiting.
		b.inflight++
		b.mu.Unlock()
		out, err := b.lone(ctx, c)
		if batch := b.finish(); batch != nil {
			go b.flushLoop(batch)
		}
		return out, err
	}
	cl := b.calls.Get().(*call)
	cl.check = c
	cl.node = node
	cl.deadline, _ = ctx.Deadline()
	b.queue = append(b.queue, cl)
	var batch []*call
	switch {
	case len(b.queue) >= b.maxBatch:
		batch = b.take()
	case len(b.queue) == 1:
		b.timer.Reset(b.maxWait)
	}
	b.mu.Unlock()
	if batch != nil {
		go b.flushLoop(batch)
	}
	select {
	case <-cl.done:
		out, err := cl.out, cl.err
		b.release(cl)
		return out, err
	case <-ctx.Done():
		b.mu.Lock()
		queued := b.remove(cl)
		b.mu.Unlock()
		if !queued {
			select {
			case <-cl.done:
				// The outcome arrived as the context ended: use it.
				out, err := cl.out, cl.err
				b.release(cl)
				return out, err
			default:
				// In flight: the pipeline will still set the outcome; nobody reads it.
				cl.given.Store(true)
				return algo.Outcome{}, runError(c, ctx.Err())
			}
		}
		b.release(cl)
		return algo.Outcome{}, runError(c, ctx.Err())
	}
}

// lone sends one request on its own.
func (b *Batcher) lone(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	vals, err := evalsha(ctx, b.store.client, &b.args, b.store.scriptFor(c.Meters).hash, c)
	if isNoScript(err) {
		return b.store.run(ctx, c, false)
	}
	return outcomeInts(vals, err, c)
}

// outcome decodes a decision script's reply to c.
func outcome(v any, err error, c algo.Check) (algo.Outcome, error) {
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	rep, err := algo.ParseDecideReply(v, c.Meters)
	return fromReply(rep, err, c)
}

// outcomeInts decodes a decision script's reply to c, read as integers.
func outcomeInts(vals []int64, err error, c algo.Check) (algo.Outcome, error) {
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	rep, err := algo.ParseDecideInts(vals, c.Meters)
	return fromReply(rep, err, c)
}

// runError is the error of a decision script for c that did not answer.
func runError(c algo.Check, err error) error {
	return fmt.Errorf("redisstore: run decision script for %q: %w", c.Keys[0], err)
}

// fromReply is the outcome of c from its parsed reply, or the parse error.
func fromReply(rep algo.Reply, err error, c algo.Check) (algo.Outcome, error) {
	if err != nil {
		return algo.Outcome{}, fmt.Errorf("redisstore: decision script for %q: %w", c.Keys[0], err)
	}
	return rep.Outcome(), nil
}

// take removes up to maxBatch calls from the head of the queue and counts a round
// trip in flight for them. b.mu must be held.
func (b *Batcher) take() []*call {
	n := min(len(b.queue), b.maxBatch)
	batch := make([]*call, n)
	copy(batch, b.queue)
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	b.inflight++
	return batch
}

// remove takes cl out of the queue, reporting whether it was still there. b.mu must
// be held.
func (b *Batcher) remove(cl *call) bool {
	for i, q := range b.queue {
		if q == cl {
			copy(b.queue[i:], b.queue[i+1:])
			b.queue[len(b.queue)-1] = nil
			b.queue = b.queue[:len(b.queue)-1]
			return true
		}
	}
	return false
}

// finish ends a round trip and returns the next batch to send, if requests queued
// behind it.
func (b *Batcher) finish() []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	if len(b.queue) == 0 {
		return nil
	}
	return b.take()
}

// expire sends the queue when its first request has waited MaxWait.
func (b *Batcher) expire() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.mu.Unlock()
		return
	}
	batch := b.take()
	b.mu.Unlock()
	b.flushLoop(batch)
}

// flushLoop sends batch, then whatever queued behind it, until the queue is empty.
func (b *Batcher) flushLoop(batch []*call) {
	for batch != nil {
		b.flush(batch)
		batch = b.finish()
	}
}

// flush sends batch (as one call, or one pipeline per node) and hands every call its
// outcome. The pipelines of a cluster's nodes go out side by side, and each hands its
// calls their outcomes when it ends: a slow or dead node delays only its own calls.
func (b *Batcher) flush(batch []*call) {
	if len(batch) > 1 && !b.store.cluster {
		ctx, cancel := batchContext(batch)
		defer cancel()
		b.flushMany(ctx, batch)
		return
	}
	groups := byNode(batch)
	if len(groups) == 1 {
		b.flushNode(batch)
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { b.flushNode(g) })
	}
	wg.Wait()
}

// byNode groups batch by node, in order of first appearance.
func byNode(batch []*call) [][]*call {
	var groups [][]*call
	for _, cl := range batch {
		i := slices.IndexFunc(groups, func(g []*call) bool { return g[0].node == cl.node })
		if i < 0 {
			groups = append(groups, nil)
			i = len(groups) - 1
		}
		groups[i] = append(groups[i], cl)
	}
	return groups
}

// flushNode sends batch, whose calls are all for one node, as one call or one
// pipeline, and hands every call its outcome.
func (b *Batcher) flushNode(batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	for _, cl := range batch {
		cl.args = b.args.command(cl.args[:0], b.store.scriptFor(cl.check.Meters).hash, cl.check)
		cl.cmd = redis.NewIntSliceCmd(ctx, cl.args...)
		cl.cmd.SetFirstKeyPos(3)
	}
	if len(batch) == 1 {
		_ = b.store.client.Process(ctx, batch[0].cmd)
	} else {
		pipe := b.store.client.Pipeline()
		for _, cl := range batch {
			_ = pipe.Process(ctx, cl.cmd)
		}
		// Each command carries its own error; Exec's is the first of them.
		_, _ = pipe.Exec(ctx)
	}
	var missing []*call
	for _, cl := range batch {
		if isNoScript(cl.cmd.Err()) {
			missing = append(missing, cl)
		}
	}
	if len(missing) > 0 {
		// The script cache was flushed (or never loaded): EVAL loads it again.
		pipe := b.store.client.Pipeline()
		for _, cl := range missing {
			cl.eval = b.store.scriptFor(cl.check.Meters).script.Eval(ctx, pipe, cl.check.Keys, algo.DecideArgs(cl.check.Meters, cl.check.Cost, cl.check.NowMicros, false)...)
		}
		_, _ = pipe.Exec(ctx)
	}
	for _, cl := range batch {
		cmd, eval := cl.cmd, cl.eval
		cl.cmd, cl.eval = nil, nil
		if !cl.given.Load() {
			if eval != nil {
				v, err := eval.Result()
				cl.out, cl.err = outcome(v, err, cl.check)
			} else {
				vals, err := cmd.Result()
				cl.out, cl.err = outcomeInts(vals, err, cl.check)
			}
		}
		cl.done <- struct{}{} // the call belongs to its waiter from here on
	}
}

// flushMany sends batch to a standalone Redis as one call of the many-request script
// and hands every call its outcome.
func (b *Batcher) flushMany(ctx context.Context, batch []*call) {
	buf := getArgs()
	defer putArgs(buf)
	args := b.args.many(*buf, b.store.manyHash, batch)
	*buf = args
	run := func() (any, error) {
		cmd := redis.NewCmd(ctx, args...)
		cmd.SetFirstKeyPos(3)
		_ = b.store.client.Process(ctx, cmd)
		return cmd.Result()
	}
	v, err := run()
	if isNoScript(err) {
		// The script did not run: load it and send the call once more.
		if err = b.store.many.Load(ctx, b.store.client).Err(); err == nil {
			v, err = run()
		}
	}
	reps, _ := v.([]any)
	if err == nil && len(reps) != len(batch) {
		err = fmt.Errorf("many-request reply has %d elements for %d requests", len(reps), len(batch))
	}
	for i, cl := range batch {
		if !cl.given.Load() {
			if err != nil {
				cl.out, cl.err = outcome(nil, err, cl.check)
			} else {
				rerr, _ := reps[i].(error)
				cl.out, cl.err = outcome(reps[i], rerr, cl.check)
			}
		}
		cl.done <- struct{}{} // the call belongs to its waiter from here on
	}
}

// release returns a call whose waiter has its outcome to the pool.
func (b *Batcher) release(cl *call) {
	clear(cl.args)
	cl.args = cl.args[:0]
	cl.check, cl.out, cl.err, cl.deadline, cl.node = algo.Check{}, algo.Outcome{}, nil, time.Time{}, ""
	b.calls.Put(cl)
}

// batchContext returns the context a pipeline runs in: no cancellation of its own
// (one caller going away must not fail the others) and the latest deadline of its
// calls, or none if one has none. Each caller still returns at its own deadline.
func batchContext(batch []*call) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, cl := range batch {
		if cl.deadline.IsZero() {
			return context.Background(), func() {}
		}
		if cl.deadline.After(last) {
			last = cl.deadline
		}
	}
	return context.WithDeadline(context.Background(), last)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// oneSlot reports whether every key hashes to the same cluster slot.
func oneSlot(keys []string) bool {
	if len(keys) < 2 {
		return true
	}
	tag := algo.HashTag(keys[0])
	for _, k := range keys[1:] {
		if algo.HashTag(k) != tag && algo.Slot(k) != algo.Slot(keys[0]) {
			return false
		}
	}
	return true
}

// argCache builds the decision script's EVALSHA command with the arguments of each
// single-limit meter computed once: a decision then boxes only its keys (and a
// recorded value), instead of formatting and boxing every number of every limit.
// The cache holds at most maxCachedMeters meters; others are formatted every time.
// Its saving shows in BenchmarkDecide's allocations per decision (unbatched and
// batcher rows), which make test runs (bench-core).
type argCache struct {
	mu sync.Mutex                         // serialises writers
	m  atomic.Pointer[map[meterKey][]any] // copy-on-write, read without locks
}

const maxCachedMeters = 1024

// meterKey identifies the constant arguments of a single-limit meter.
type meterKey struct {
	limit  algo.Limit
	shadow bool
}

// Boxed constants, so that building a command boxes nothing it can avoid.
var (
	evalshaArg any = "evalsha"
	emptyArg   any = ""
	zeroArg    any = "0"
	smallInts      = func() (s [65]any) {
		for i := range s {
			s[i] = strconv.Itoa(i)
		}
		return s
	}()
)

func smallInt(n int64) any {
	if n >= 0 && n < int64(len(smallInts)) {
		return smallInts[n]
	}
	return strconv.FormatInt(n, 10)
}

// command appends to dst the EVALSHA of the decision script (hash) for c, undo off:
// the same arguments as algo.DecideArgs.
func (a *argCache) command(dst []any, hash any, c algo.Check) []any {
	dst = append(dst, evalshaArg, hash, len(c.Keys))
	for i := range c.Keys {
		// A *string boxes without allocating; go-redis writes it, and hashes it to a
		// cluster slot, as the string.
		dst = append(dst, &c.Keys[i])
	}
	return a.argv(dst, c)
}

// argv appends the decision script's ARGV for c, undo off.
func (a *argCache) argv(dst []any, c algo.Check) []any {
	now := emptyArg
	if c.NowMicros != 0 {
		now = strconv.FormatInt(c.NowMicros, 10)
	}
	return a.tail(append(dst, now, smallInt(c.Cost)), c)
}

// tail appends the decision script's ARGV for c from the third on (undo off, the
// meters): what does not change from one request of the same meters to the next.
func (a *argCache) tail(dst []any, c algo.Check) []any {
	dst = append(dst, zeroArg, smallInt(int64(len(c.Meters))))
	for _, m := range c.Meters {
		dst = a.meter(dst, m)
	}
	return dst
}

// shared returns the cached arguments of c's one meter, which every request of that
// meter shares, or nil when c has several meters, its meter several limits or a
// recorded value, or its meter is not cached.
func (a *argCache) shared(c algo.Check) []any {
	if len(c.Meters) != 1 || len(c.Meters[0].Limits) != 1 || c.Meters[0].Record != "" {
		return nil
	}
	if mp := a.m.Load(); mp != nil {
		return (*mp)[meterKey{c.Meters[0].Limits[0], c.Meters[0].Shadow}]
	}
	return nil
}

// meter appends the script arguments of m.
func (a *argCache) meter(dst []any, m algo.Meter) []any {
	if len(m.Limits) != 1 {
		return algo.AppendMeterArgs(dst, m)
	}
	k := meterKey{m.Limits[0], m.Shadow}
	var args []any
	if mp := a.m.Load(); mp != nil {
		args = (*mp)[k]
	}
	if args == nil {
		args = a.add(k, m)
	}
	n := len(dst)
	dst = append(dst, args...)
	if m.Record != "" {
		dst[n+2] = m.Record
	}
	return dst
}

// add computes and, while the cache has room, keeps the arguments of a meter.
func (a *argCache) add(k meterKey, m algo.Meter) []any {
	m.Record = ""
	args := algo.AppendMeterArgs(nil, m)
	a.mu.Lock()
	defer a.mu.Unlock()
	old := a.m.Load()
	var n int
	if old != nil {
		n = len(*old)
	}
	if n >= maxCachedMeters {
		return args
	}
	next := make(map[meterKey][]any, n+1)
	if old != nil {
		for kk, v := range *old {
			next[kk] = v
		}
	}
	next[k] = args
	a.m.Store(&next)
	return args
}

// many appends to dst the EVALSHA of the many-request script (hash) for batch (see
// lua/many.lua): every request's keys, then one profile per distinct cached meter
// (and one per request whose meters are not shared), then per request its key count,
// profile, time and cost.
func (a *argCache) many(dst []any, hash any, batch []*call) []any {
	nkeys := 0
	for _, cl := range batch {
		nkeys += len(cl.check.Keys)
	}
	dst = append(dst, evalshaArg, hash, nkeys)
	for _, cl := range batch {
		for i := range cl.check.Keys {
			dst = append(dst, &cl.check.Keys[i])
		}
	}
	// Requests of the same cached meter share one profile: their limits go once.
	prof := make([]int, len(batch))
	var shared []*any // each profile's first cached argument; nil: not shared
	dst = append(dst, smallInt(int64(len(batch))), nil)
	np := len(dst) - 1
	for i, cl := range batch {
		sh := a.shared(cl.check)
		if sh != nil {
			if j := slices.Index(shared, &sh[0]); j >= 0 {
				prof[i] = j
				continue
			}
		}
		prof[i] = len(shared)
		at := len(dst)
		dst = append(dst, nil)
		dst = a.tail(dst, cl.check)
		dst[at] = smallInt(int64(len(dst) - at - 1))
		if sh == nil {
			// tail may just have cached the meter: later requests can share it
			sh = a.shared(cl.check)
		}
		var first *any
		if sh != nil {
			first = &sh[0]
		}
		shared = append(shared, first)
	}
	dst[np] = smallInt(int64(len(shared)))
	for i, cl := range batch {
		now := emptyArg
		if cl.check.NowMicros != 0 {
			now = strconv.FormatInt(cl.check.NowMicros, 10)
		}
		dst = append(dst, smallInt(int64(len(cl.check.Keys))), smallInt(int64(prof[i]+1)), now, smallInt(cl.check.Cost))
	}
	return dst
}
