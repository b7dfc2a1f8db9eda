package redisstore

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// The commonest request, one fixed_window limit, is decided with no script: INCRBY of
// the window's key and PEXPIREAT of its end, pipelined in one round trip, then, only
// when the count went past the limit, DECRBY in a second, so a denied request leaves
// nothing charged. envoyproxy/ratelimit sends INCRBY + EXPIRE. Redis's instructions
// per decision (make callgrind; docs/design/redis-functions.md): 13,300 on a new key
// against 12,900 for INCRBY + EXPIRE, 7,100 for INCRBY alone in a window this store
// has counted in, 55,000 for the library's call. (EXPIRE is relative: Redis rewrites
// it into an absolute expiry for its replicas and AOF, which PEXPIREAT does not need.)
//
// The window is named by this process's clock (the caller's clock, as
// envoyproxy/ratelimit names it), not the server's: instances whose clocks differ by
// d count a request that arrives within d of a window's edge in different windows. No
// window ever holds more than its limit; with clocks kept by NTP (milliseconds apart)
// the edge moves by milliseconds. The key expires at the window's end by this clock
// plus a second of slack, for an instance whose clock runs behind; a Redis server
// whose clock runs more than that second ahead would expire windows early. (A caller
// that passes its own time, which need not be the wall clock's, gets a TTL relative
// to it instead, PEXPIRE ... NX, as the library gives it.)
//
// A window is remembered (windowSet) once its key is known to have its expiry; later
// requests in it send INCRBY alone (BenchmarkCounted, which make bench-core runs,
// reports the commands per decision). When that INCRBY answers its own cost, the key was
// gone (a restart, a flush, an eviction) and INCRBY made it anew: its expiry follows
// in a second round trip.
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
// a charge that waits for replicas, a peek (cost 0), a cost above the limit, any
// other algorithm.

// counts reports whether c is decided by counting (see above).
func (s *Store) counts(c algo.Check) bool {
	if len(c.Meters) != 1 || c.Cost <= 0 || c.Settle || !s.clockInStep() {
		return false
	}
	m := c.Meters[0]
	// A cost above the limit can never be admitted: the library answers it without
	// creating the window's key. Every other denial finds the key made by an earlier
	// charge (the first INCRBY of a window always admits). A period under a
	// millisecond is no window (the library refuses it).
	return len(m.Limits) == 1 && m.Limits[0].Algorithm == algo.FixedWindow && c.Cost <= m.Limits[0].Count &&
		m.Limits[0].Period >= time.Millisecond && m.Record == "" && m.Replicas.Count == 0
}

// ttlSlack is added to a counted window's expiry: another instance's clock may run
// behind this one's, and the key must outlive the window by that instance's clock too.
const ttlSlack = time.Second

// maxClockOffset is the most this process's clock may differ from the Redis server's
// for the store to count windows on it (checkClock); half the slack, so that a key
// outlives its window by both clocks.
const maxClockOffset = ttlSlack / 2

// checkClock compares this process's clock with the server's TIME (the midpoint of
// the round trip) and turns counting off while they differ by more than
// maxClockOffset: windows then take the library, on the server's clock. Preload runs
// it. It returns the offset (the server's clock minus this one's).
func (s *Store) checkClock(ctx context.Context) (time.Duration, error) {
	before := time.Now()
	server, err := s.serverMicros(ctx)
	if err != nil {
		return 0, err
	}
	mid := before.Add(time.Since(before) / 2)
	off := time.UnixMicro(server).Sub(mid)
	s.clockOffset.Store(int64(off))
	return off, nil
}

// clockInStep reports whether the last offset measured is within maxClockOffset.
func (s *Store) clockInStep() bool {
	off := time.Duration(s.clockOffset.Load())
	return off <= maxClockOffset && off >= -maxClockOffset
}

// ClockOffset returns the Redis server's clock minus this process's, as the last
// Preload measured it, and whether the store counts fixed windows on this process's
// clock (the offset is within half a second).
func (s *Store) ClockOffset() (time.Duration, bool) {
	return time.Duration(s.clockOffset.Load()), s.clockInStep()
}

// A countCall is one request decided by counting. It keeps what it needs of the
// check: the caller may reuse the check's slices once Decide returns, which a call
// whose caller gave up outlives.
type countCall struct {
	limit    algo.Limit
	shadow   bool
	cost     int64
	callerAt bool   // the caller passed its own time
	key      string // the window's key
	now      int64  // Unix µs: the caller's clock
	expiry   int64  // the key's expiry, Unix ms
	known    bool   // the window is in the store's windowSet: no PEXPIREAT is sent
	incr     *redis.IntCmd
	expire   *redis.BoolCmd // nil when known
}

// newCountCall returns the call for c, which counts (Store.counts).
func (s *Store) newCountCall(ctx context.Context, c algo.Check) *countCall {
	now := nowOr(c.NowMicros)
	l := c.Meters[0].Limits[0]
	key, end := l.WindowKey(c.Keys[0], now)
	cc := &countCall{limit: l, shadow: c.Meters[0].Shadow, cost: c.Cost, callerAt: c.NowMicros != 0,
		key: key, now: now, expiry: (end + ttlSlack.Microseconds() + 999) / 1000}
	cc.incr = redis.NewIntCmd(ctx, "incrby", key, c.Cost)
	if cc.known = s.windows.has(key, now); !cc.known {
		cc.expire = cc.expireCmd(ctx, true)
	}
	return cc
}

// expireCmd sets the expiry of cc's key: PEXPIREAT on this process's clock (the same
// instant from every request of the window); when the caller passed its own time,
// which need not be the wall clock's, relative to it, and with nx set only by the
// window's first request (PEXPIRE ... NX; a server before Redis 7 refuses NX, and
// the second round trip sends it without).
func (cc *countCall) expireCmd(ctx context.Context, nx bool) *redis.BoolCmd {
	switch {
	case !cc.callerAt:
		return redis.NewBoolCmd(ctx, "pexpireat", cc.key, cc.expiry)
	case nx:
		return redis.NewBoolCmd(ctx, "pexpire", cc.key, cc.expiry-cc.now/1000, "nx")
	}
	return redis.NewBoolCmd(ctx, "pexpire", cc.key, cc.expiry-cc.now/1000)
}

// cmds returns the commands of cc's first round trip.
func (cc *countCall) cmds() []redis.Cmder {
	if cc.expire == nil {
		return []redis.Cmder{cc.incr}
	}
	return []redis.Cmder{cc.incr, cc.expire}
}

// answer is the reply to cc once its first round trip ran, and the commands its
// second must send (none for most): a denial's DECRBY, with the key's expiry (the
// key may have gone between the two: DECRBY would make it anew, without one); the
// expiry of a key that may lack it (its PEXPIREAT failed, or a remembered window's
// INCRBY made the key anew and so answered its own cost). A count that did not run
// is an error.
func (cc *countCall) answer(ctx context.Context) (algo.Reply, []redis.Cmder, error) {
	n, err := cc.incr.Result()
	if err != nil {
		return algo.Reply{}, nil, fmt.Errorf("redisstore: decide %q: %w", cc.key, err)
	}
	d := cc.limit.Counted(cc.now, n-cc.cost, cc.cost)
	rep := algo.Reply{Allowed: d.Allowed || cc.shadow, NowMicros: cc.now, Decisions: [][]algo.Decision{{d}}}
	var more []redis.Cmder
	if !d.Allowed {
		more = append(more, redis.NewIntCmd(ctx, "decrby", cc.key, cc.cost))
	}
	switch {
	case !cc.known && cc.expire.Err() != nil:
		more = append(more, cc.expireCmd(ctx, false))
	case cc.known && n == cc.cost, !d.Allowed:
		more = append(more, cc.expireCmd(ctx, !cc.known || n != cc.cost))
	}
	return rep, more, nil
}

// remember adds cc's window to the store's windowSet once its key is known to have
// its expiry; a remembered window whose key came back without one is forgotten until
// a request sets it again.
func (s *Store) remember(cc *countCall) {
	switch {
	case !cc.known && cc.expire.Err() == nil:
		s.windows.add(cc.key, cc.expiry*1000, cc.now)
	case cc.known && cc.incr.Err() == nil && cc.incr.Val() == cc.cost:
		s.windows.forget(cc.key)
	}
}

// followUp sends the second round trip of counted requests, even when ctx has ended:
// a denied request must not stay charged. A command that fails leaves the units
// counted (under-admission within the window) or the window unremembered; each is
// counted in the store's FollowUpsFailed.
func (s *Store) followUp(ctx context.Context, cmds []redis.Cmder) {
	if len(cmds) == 0 {
		return
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	s.pipeline(rctx, cmds)
	for _, c := range cmds {
		if c.Err() != nil {
			s.followUpsFailed.Add(1)
		}
	}
}

// FollowUpsFailed returns how many commands of counted requests' second round trips
// failed (a denial's DECRBY, a key's expiry): each leaves a denied request's units
// counted until its window ends, or a key whose expiry the next request of its window
// sets.
func (s *Store) FollowUpsFailed() int64 { return s.followUpsFailed.Load() }

// sendCounts sends the first round trip of ccs with pre (more commands for the same
// node) and, on a cluster, once more the counts whose slot had moved (MOVED: the
// command did not run) after learning the new map. Other errors are final: a count
// that timed out may have run.
func (s *Store) sendCounts(ctx context.Context, ccs []*countCall, send func(pre []redis.Cmder)) {
	var pre []redis.Cmder
	for _, cc := range ccs {
		pre = append(pre, cc.cmds()...)
	}
	send(pre)
	if s.cc == nil {
		return
	}
	var again []redis.Cmder
	for _, cc := range ccs {
		if _, moved := redis.IsMovedError(cc.incr.Err()); moved {
			again = append(again, cc.cmds()...)
		}
	}
	if len(again) > 0 {
		s.cc.ReloadState(ctx)
		s.pipeline(ctx, again)
	}
}

// count decides c, which counts, on its own: one round trip, two for a denial.
func (s *Store) count(ctx context.Context, c algo.Check) (algo.Reply, error) {
	cc := s.newCountCall(ctx, c)
	s.sendCounts(ctx, []*countCall{cc}, func(pre []redis.Cmder) { s.pipeline(ctx, pre) })
	rep, more, err := cc.answer(ctx)
	s.remember(cc)
	s.followUp(ctx, more)
	return rep, err
}

// decideOne decides c, a request of one node or slot, on its own: by counting when
// it counts, else with the library's decide.
func (s *Store) decideOne(ctx context.Context, c algo.Check) (algo.Reply, error) {
	if s.counts(c) {
		return s.count(ctx, c)
	}
	return s.call(ctx, c, false)
}

// maxWindows bounds a windowSet. A service with more clients active in one window
// than this sends their PEXPIREAT again, as it does for a window it has not seen.
const maxWindows = 1 << 16

// A windowSet holds the counted windows known to exist with their expiry in Redis,
// each until it expires (Unix µs). It is safe for simultaneous use.
type windowSet struct {
	mu      sync.Mutex
	expires map[string]int64
}

// forget drops the window key.
func (w *windowSet) forget(key string) {
	w.mu.Lock()
	delete(w.expires, key)
	w.mu.Unlock()
}

// has reports whether the window key is known at now.
func (w *windowSet) has(key string, now int64) bool {
	w.mu.Lock()
	exp, ok := w.expires[key]
	w.mu.Unlock()
	return ok && exp > now
}

// add remembers the window key until it expires at exp. A full set first forgets
// the windows that have expired by now, and everything when that frees less than a
// quarter of it: each pass over the set then makes room for a quarter of it at least,
// so a set that stays full costs its adds a few steps each, not a pass each.
func (w *windowSet) add(key string, exp, now int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.expires == nil {
		w.expires = map[string]int64{}
	}
	if _, ok := w.expires[key]; !ok && len(w.expires) >= maxWindows {
		maps.DeleteFunc(w.expires, func(_ string, e int64) bool { return e <= now })
		if len(w.expires) > maxWindows/4*3 {
			clear(w.expires)
		}
	}
	w.expires[key] = exp
}
