package redisstore

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// Defaults of Options' batching.
const (
	DefaultMaxBatch = 64
	// DefaultBatchWait: a Redis round trip under load takes a few hundred
	// microseconds; a queue that goes out on its own sooner makes smaller batches,
	// which cost Redis and the service a write and a read each. make bench-erl at
	// concurrency 64, on 2026-11-26: at 50µs 1.36× envoyproxy/ratelimit's throughput
	// and 1.06× its Redis CPU per decision (one run); at 300µs 1.39–1.75× and
	// 0.84–0.98× (seven runs).
	DefaultBatchWait = 300 * time.Microsecond
)

// Batching is how a store with Options.BatchWait sends: a lone request goes out at
// once; only when a round trip is already under way do arriving requests queue, and
// the queue goes out when that round trip ends, when it holds MaxBatch requests, or
// after BatchWait, whichever comes first. A batch is one pipeline per node: the
// commands of the requests that count (count.go), then, on a standalone Redis, one
// call of the Lua library's many entry (algo.EntryMany) for the others, or on a
// cluster one decide call per request. Either way each request is decided
// all-or-nothing on its own, with its own reply or error; only the round trip is
// shared. Store.routeOf says which requests never join a batch. The goroutines that
// send batches end a second after the last one.

// A batcher is a store's queue of requests waiting for a round trip.
type batcher struct {
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
	rep      algo.Reply
	err      error
	done     chan struct{} // receives once the reply is set
	given    atomic.Bool   // the waiter gave up (its context ended) after the call was taken
}

// newBatcher returns the batcher of store with o, or nil when o turns batching off.
func newBatcher(store *Store, o Options) *batcher {
	if o.BatchWait == 0 || o.MaxBatch == 1 {
		return nil
	}
	b := &batcher{
		store:    store,
		maxBatch: def(o.MaxBatch, DefaultMaxBatch),
		maxWait:  o.BatchWait,
	}
	b.calls.New = func() any { return &call{done: make(chan struct{}, 1)} }
	b.flushes = make(chan []*call)
	b.timer = time.AfterFunc(time.Hour, b.expire)
	b.timer.Stop()
	return b
}

// decide decides c, a request for node already let through by its breaker, sharing
// the round trip with the requests in flight at the same time. It returns when the
// reply is known or ctx ends, whichever comes first.
func (b *batcher) decide(ctx context.Context, c algo.Check, node string) (algo.Reply, error) {
	b.mu.Lock()
	if b.inflight == 0 && len(b.queue) == 0 {
		// Nothing in flight: go now, without waiting.
		b.inflight++
		b.mu.Unlock()
		rep, err := b.store.decideOne(ctx, c)
		if batch := b.finish(); batch != nil {
			b.handOff(batch)
		}
		return rep, err
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
		return b.release(cl)
	case <-ctx.Done():
		b.mu.Lock()
		queued := b.remove(cl)
		b.mu.Unlock()
		if !queued {
			select {
			case <-cl.done:
				// The reply arrived as the context ended: use it.
				return b.release(cl)
			default:
				// In flight: the pipeline will still set the reply; nobody reads it.
				cl.given.Store(true)
				return algo.Reply{}, runError(c, ctx.Err())
			}
		}
		b.release(cl)
		return algo.Reply{}, runError(c, ctx.Err())
	}
}

// take removes up to maxBatch calls from the head of the queue and counts a round
// trip in flight for them. b.mu must be held.
func (b *batcher) take() []*call {
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
func (b *batcher) remove(cl *call) bool {
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
func (b *batcher) finish() []*call {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.inflight--
	if len(b.queue) == 0 {
		return nil
	}
	return b.take()
}

// expire sends the queue when its first request has waited MaxWait.
func (b *batcher) expire() {
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
func (b *batcher) handOff(batch []*call) {
	select {
	case b.flushes <- batch:
	default:
		go b.flusher(batch)
	}
}

// flusher sends batch, and the batches handed to it after, until none comes for
// flusherIdle.
func (b *batcher) flusher(batch []*call) {
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
func (b *batcher) flushLoop(batch []*call) {
	for batch != nil {
		b.flush(batch)
		batch = b.finish()
	}
}

// flush sends batch and hands every call its outcome. The round trips of a cluster's
// nodes go out side by side, and each hands its calls their outcomes when it ends: a
// slow or dead node delays only its own calls.
func (b *batcher) flush(batch []*call) {
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

// flushNode sends batch, whose calls are all for one node, in one round trip: the
// requests that count (count.go) as their commands; the others as one call of the
// library's many entry on a standalone Redis, or one decide call each on a cluster's
// node (the many entry's keys would span slots). It hands every call its reply; the
// counted ones after their denials' units are given back.
func (b *batcher) flushNode(batch []*call) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	s := b.store
	var counts []*countCall
	var counting, scripted []*call
	for _, cl := range batch {
		if s.counts(cl.check) {
			counts, counting = append(counts, s.newCountCall(ctx, cl.check)), append(counting, cl)
		} else {
			scripted = append(scripted, cl)
		}
	}
	var calls []*scriptCall
	many := !s.cluster && len(scripted) > 1
	if many {
		checks := make([]algo.Check, len(scripted))
		for i, cl := range scripted {
			checks[i] = cl.check
		}
		keys, args := algo.ManyCall(checks)
		calls = []*scriptCall{entryCall(algo.EntryMany, keys, args)}
	} else {
		for _, cl := range scripted {
			calls = append(calls, decideCall(cl.check, false))
		}
	}
	s.sendCounts(ctx, counts, func(pre []redis.Cmder) { s.execWith(ctx, pre, calls) })
	if many {
		answerMany(calls[0], scripted)
	} else {
		for i, cl := range scripted {
			answer(cl, func() (algo.Reply, error) { return calls[i].answer(cl.check) })
		}
	}
	// A counted request is answered at once, unless its second round trip gives back
	// its units (a denial) or sets its key's expiry: then after it.
	var more []redis.Cmder
	waiting := make([]bool, len(counts))
	reps, errs := make([]algo.Reply, len(counts)), make([]error, len(counts))
	for i, cc := range counts {
		var m []redis.Cmder
		reps[i], m, errs[i] = cc.answer(ctx)
		s.remember(cc)
		if waiting[i] = len(m) > 0; !waiting[i] {
			answer(counting[i], func() (algo.Reply, error) { return reps[i], errs[i] })
		}
		more = append(more, m...)
	}
	s.followUp(ctx, more)
	for i, cl := range counting {
		if waiting[i] {
			answer(cl, func() (algo.Reply, error) { return reps[i], errs[i] })
		}
	}
}

// answerMany hands each call of batch its part of the reply of sc, the many entry's
// call for them.
func answerMany(sc *scriptCall, batch []*call) {
	v, err := sc.value()
	reps, ok := v.([]any)
	if err == nil && (!ok || len(reps) != len(batch)) {
		err = fmt.Errorf("many-request reply is %T of %d elements for %d requests", v, len(reps), len(batch))
	}
	for i, cl := range batch {
		answer(cl, func() (algo.Reply, error) {
			if err != nil {
				return decoded(cl.check, nil, nil, err)
			}
			rerr, _ := reps[i].(error)
			return decoded(cl.check, nil, reps[i], rerr)
		})
	}
}

// answer hands cl the reply get returns, unless its waiter gave up; from here on the
// call belongs to its waiter.
func answer(cl *call, get func() (algo.Reply, error)) {
	if !cl.given.Load() {
		cl.rep, cl.err = get()
	}
	cl.done <- struct{}{}
}

// release returns a call whose waiter is done with it to the pool, and the reply it
// held.
func (b *batcher) release(cl *call) (algo.Reply, error) {
	rep, err := cl.rep, cl.err
	cl.check, cl.rep, cl.err, cl.deadline, cl.node = algo.Check{}, algo.Reply{}, nil, time.Time{}, ""
	b.calls.Put(cl)
	return rep, err
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
