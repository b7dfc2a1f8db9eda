package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
)

// Defaults of BatchConfig.
const (
	DefaultMaxBatch = 64
	// DefaultMaxWait: a Redis round trip under load takes a few hundred
	// microseconds; a queue that goes out on its own sooner makes smaller batches,
	// which cost Redis and the service a write and a read each. make bench-erl at
	// concurrency 64, on 2026-11-26: at 50µs 1.36× envoyproxy/ratelimit's throughput
	// and 1.06× its Redis CPU per decision (one run); at 300µs 1.39–1.75× and
	// 0.84–0.98× (seven runs).
	DefaultMaxWait = 300 * time.Microsecond
)

// BatchConfig configures a Batcher. The zero value of each field takes its default.
type BatchConfig struct {
	// MaxBatch is the most requests sent in one batch (default 64). A queue that
	// reaches it goes out at once, even while another batch is in flight. 1 turns
	// batching off: every request is its own call, as with Store.Decide.
	MaxBatch int
	// MaxWait bounds how long a queued request waits for the round trip in flight
	// ahead of it before its queue goes out as a batch of its own (default 300µs). A
	// request that finds nothing in flight never waits.
	MaxWait time.Duration
}

// A Batcher decides requests on a Store, sending the requests that arrive while others
// are in flight to Redis together. A lone request goes out at once; only when a round
// trip is already under way do arriving requests queue, and the queue goes out when
// that round trip ends, when it holds MaxBatch requests, or after MaxWait, whichever
// comes first. On a standalone Redis a batch is one call of the Lua library's many
// entry (algo.EntryMany); on a cluster it is one pipeline per node of one decide call
// per request. Either way each request is decided all-or-nothing on its own, with its own
// reply or error; only the round trip is shared. A request whose keys span several
// cluster slots bypasses the batcher and takes Store.Decide (with its refunds), and so
// does one that waits for replicas (algo.Replicas): WAIT covers a connection's writes.
//
// A standalone endpoint that is really a sharding proxy (twemproxy, Envoy's Redis
// proxy) cannot run one script over several clients' keys: do not batch behind one.
//
// Batcher implements the engine's Store interface. It is safe for simultaneous use;
// the goroutines that send batches end a second after the last one.
type Batcher struct {
	store    *Store
	maxBatch int
	maxWait  time.Duration
	calls    sync.Pool

	mu       sync.Mutex
	queue    []*call
	inflight int // round trips (lone or pipelined) under way
	timer    *time.Timer
	// flushes hands a batch to an idle flusher (see handOff).
	flushes chan []*call
}

// call is one queued request.
type call struct {
	check    algo.Check
	node     string    // the node that holds its keys
	deadline time.Time // zero: none
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
	b.flushes = make(chan []*call)
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

// Refund gives back units charged in the store (Store.Refund), so that a batched
// engine's leases give back what they did not spend.
func (b *Batcher) Refund(ctx context.Context, c algo.Check, chargedMicros int64) error {
	return b.store.Refund(ctx, c, chargedMicros)
}

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
	if len(c.Keys) != len(c.Meters) || len(c.Meters) == 0 || (b.store.cluster && !oneSlot(c.Keys)) || c.Cost > 0 && c.Replicas().Count > 0 {
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
			b.handOff(batch)
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
		b.handOff(batch)
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
	return b.store.run(ctx, c, false)
}

// outcome decodes the decide entry's reply to c.
func outcome(v any, err error, c algo.Check) (algo.Outcome, error) {
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	rep, err := algo.ParseDecideReply(v, c.Meters)
	return fromReply(rep, err, c)
}

// runError is the error of a decide call for c that did not answer.
func runError(c algo.Check, err error) error {
	return fmt.Errorf("redisstore: decide %q: %w", c.Keys[0], err)
}

// fromReply is the outcome of c from its parsed reply, or the parse error.
func fromReply(rep algo.Reply, err error, c algo.Check) (algo.Outcome, error) {
	if err != nil {
		return algo.Outcome{}, fmt.Errorf("redisstore: decide %q: reply: %w", c.Keys[0], err)
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
	b.handOff(batch)
}

// flusherIdle is how long a flusher waits for another batch before it ends.
const flusherIdle = time.Second

// handOff sends batch on a flusher that is idle, or on a new one. A flusher waits a
// while for the next batch before it ends, so that under load batches go out on
// goroutines whose stacks have already grown to what a pipeline needs: a goroutine
// per batch spent a tenth of BenchmarkShouldRateLimit's CPU growing its stack.
func (b *Batcher) handOff(batch []*call) {
	select {
	case b.flushes <- batch:
	default:
		go b.flusher(batch)
	}
}

// flusher sends batch, and the batches handed to it after, until none comes for
// flusherIdle.
func (b *Batcher) flusher(batch []*call) {
	idle := time.NewTimer(flusherIdle)
	defer idle.Stop()
	for {
		b.flushLoop(batch)
		idle.Reset(flusherIdle)
		select {
		case batch = <-b.flushes:
		case <-idle.C:
			return
		}
	}
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
	calls := make([]*scriptCall, len(batch))
	for i, cl := range batch {
		calls[i] = decideCall(cl.check, false)
	}
	b.store.exec(ctx, calls...)
	for i, cl := range batch {
		if !cl.given.Load() {
			rep, err := calls[i].reply(cl.check.Meters)
			cl.out, cl.err = fromReply(rep, err, cl.check)
		}
		cl.done <- struct{}{} // the call belongs to its waiter from here on
	}
}

// flushMany sends batch to a standalone Redis as one call of the library's many
// entry and hands every call its outcome.
func (b *Batcher) flushMany(ctx context.Context, batch []*call) {
	checks := make([]algo.Check, len(batch))
	for i, cl := range batch {
		checks[i] = cl.check
	}
	keys, args := algo.ManyCall(checks)
	sc := entryCall(algo.EntryMany, keys, args)
	b.store.exec(ctx, sc)
	v, err := sc.value()
	reps, ok := v.([]any)
	if err == nil && (!ok || len(reps) != len(batch)) {
		err = fmt.Errorf("many-request reply is %T of %d elements for %d requests", v, len(reps), len(batch))
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
