package redisstore

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// The commonest request, one fixed_window limit, is decided with no script: INCRBY of
// the window's key and PEXPIRE ... NX, pipelined in one round trip, then, only when
// the count went past the limit, DECRBY in a second, so a denied request leaves
// nothing charged. It is what envoyproxy/ratelimit sends (INCRBY + EXPIRE), and it
// costs Redis about a third of the library's call (the lone fixed_window decision
// under callgrind; make bench-erl's Redis CPU per decision).
//
// The window is named by this process's clock (the caller's clock, as
// envoyproxy/ratelimit names it), not the server's: instances whose clocks differ by
// d count a request that arrives within d of a window's edge in different windows. No
// window ever holds more than its limit; with clocks kept by NTP (milliseconds apart)
// the edge moves by milliseconds. The key's TTL is the window's end plus a second of
// slack, set by whichever request creates the key (NX: a later request sends it but
// Redis ignores it and replicates nothing).
//
// All-or-nothing holds: a request of one limit is admitted exactly when its INCRBY
// leaves the count within the limit. The transient: between a denied request's INCRBY
// and its DECRBY (one round trip), other requests of the same window see its units
// counted and may be denied where they would have been admitted; they are never
// admitted where they would not have been, the same bound as a cluster's refund. A
// DECRBY that fails (Redis gone between the two round trips) leaves the denied units
// counted until the window ends: under-admission by that request's cost, never
// over-admission.
//
// Requests that need more take the library: several meters, a record, a settlement,
// a charge that waits for replicas, a peek (cost 0), any other algorithm.

// counts reports whether c is decided by counting (see above).
func (s *Store) counts(c algo.Check) bool {
	if len(c.Meters) != 1 || c.Cost <= 0 || c.Settle {
		return false
	}
	m := c.Meters[0]
	// A cost above the limit can never be admitted: the library answers it without
	// creating the window's key. Every other denial finds the key made by an earlier
	// charge (the first INCRBY of a window always admits), so a DECRBY never leaves
	// behind a key that would not have existed.
	return len(m.Limits) == 1 && m.Limits[0].Algorithm == algo.FixedWindow && c.Cost <= m.Limits[0].Count &&
		m.Record == "" && m.Replicas.Count == 0
}

// ttlSlack is added to a counted window's TTL: another instance's clock may run behind
// this one's, and the key must outlive the window by that instance's clock too.
const ttlSlack = time.Second

// A countCall is one request decided by counting.
type countCall struct {
	check  algo.Check
	key    string // the window's key
	now    int64  // Unix µs: the caller's clock
	ttl    int64  // the key's TTL, ms
	incr   *redis.IntCmd
	expire *redis.BoolCmd
}

// newCountCall returns the call for c, which counts (Store.counts).
func newCountCall(ctx context.Context, c algo.Check, nx bool) *countCall {
	now := nowOr(c.NowMicros)
	key, end := c.Meters[0].Limits[0].WindowKey(c.Keys[0], now)
	cc := &countCall{check: c, key: key, now: now, ttl: (end - now + ttlSlack.Microseconds() + 999) / 1000}
	cc.incr = redis.NewIntCmd(ctx, "incrby", key, c.Cost)
	if nx {
		cc.expire = redis.NewBoolCmd(ctx, "pexpire", key, cc.ttl, "nx")
	} else {
		cc.expire = redis.NewBoolCmd(ctx, "pexpire", key, cc.ttl)
	}
	return cc
}

// answer is the reply to cc once its commands ran, and whether its units must be
// given back (a denial). A count that did not run is an error.
func (cc *countCall) answer() (algo.Reply, bool, error) {
	n, err := cc.incr.Result()
	if err != nil {
		return algo.Reply{}, false, runError(cc.check, err)
	}
	m := cc.check.Meters[0]
	d := m.Counted(cc.now, n-cc.check.Cost, cc.check.Cost)
	rep := algo.Reply{Allowed: d.Allowed || m.Shadow, NowMicros: cc.now, Decisions: [][]algo.Decision{{d}}}
	return rep, !d.Allowed, nil
}

// counted answers the counts in ccs, which ran, each into reps[i] and errs[i]: a
// denied request's units are given back, and a key whose PEXPIRE failed gets it
// again, together in one more round trip. That round trip runs even when ctx has
// ended: a denied request must not stay charged.
func (s *Store) counted(ctx context.Context, ccs []*countCall, reps []algo.Reply, errs []error) {
	var more []redis.Cmder
	for i, cc := range ccs {
		var undo bool
		reps[i], undo, errs[i] = cc.answer()
		if errs[i] != nil {
			continue
		}
		if undo {
			more = append(more, redis.NewIntCmd(ctx, "decrby", cc.key, cc.check.Cost))
		}
		if err := cc.expire.Err(); err != nil {
			var reply redis.Error
			if errors.As(err, &reply) && s.expireNX.Load() {
				// A server before Redis 7 has no PEXPIRE NX: set the TTL without it,
				// from now on too (each request then sets the window's end again).
				s.expireNX.Store(false)
			}
			more = append(more, redis.NewBoolCmd(ctx, "pexpire", cc.key, cc.ttl))
		}
	}
	if len(more) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	s.pipeline(rctx, more)
}

// count decides c, which counts, on its own: one round trip, two for a denial.
func (s *Store) count(ctx context.Context, c algo.Check) (algo.Reply, error) {
	cc := newCountCall(ctx, c, s.expireNX.Load())
	s.pipeline(ctx, []redis.Cmder{cc.incr, cc.expire})
	reps, errs := make([]algo.Reply, 1), make([]error, 1)
	s.counted(ctx, []*countCall{cc}, reps, errs)
	return reps[0], errs[0]
}

// decideOne decides c, a request of one node or slot, on its own: by counting when
// it counts, else with the library's decide.
func (s *Store) decideOne(ctx context.Context, c algo.Check) (algo.Reply, error) {
	if s.counts(c) {
		return s.count(ctx, c)
	}
	return s.call(ctx, c, false)
}
