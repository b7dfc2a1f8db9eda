package engine

import (
	"context"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// Leases serve a hot limit (policy.Lease) from a slice of its quota that this
// instance reserves in the store and spends in process.
//
// A reservation is an ordinary store decision of cost Units on the limit's key: the
// store charges it like Units requests, atomically, or denies it. Every admission
// from a lease spends one of those charged units, at or after the reservation, so
// the store's count of a key is always at least the units this instance admitted
// plus the units it still holds. Hence, for each algorithm:
//
//   - fixed_window: a lease is spent only inside the window its reservation was
//     charged in (it ends at that window's end, measured from our clock when the
//     reservation was sent, so it ends no later than the store's window whatever
//     the offset between the clocks). Admissions in window w are at most the units
//     charged to w, which the store kept at most Count: never more than the limit
//     in any window, exactly.
//   - sliding_window: likewise a lease is spent only in the window it was charged
//     in, so each window's counter (cur, later prev) holds at least that window's
//     admissions; refunds take off only units never spent. At any time t in window
//     w the estimate over the real admissions, prev·(1-f(t)) + admitted_w(≤t), is at
//     most prev'·(1-f(r)) + cur'(r) for the last reservation r ≤ t, which the store
//     checked to be at most Count (counters only fall between r and t, and the
//     weight 1-f only falls): the algorithm's bound holds as without leases.
//   - token_bucket and gcra: the bucket (the TAT) never gives out more than its
//     capacity C plus its refill r·length over any interval. A reservation takes
//     Units + m out, m = ⌈r·For⌉ (policy.Lease.Margin), and spends at most Units,
//     each within For after it. The units admitted in an interval [a,b] come from
//     the k ≥ 1 reservations made in [a−For, b], which took out at most
//     C + r·(b−a+For) ≥ Σ(Units_i + m): so Σ Units_i ≤ C + r·(b−a) + m − k·m ≤
//     C + r·(b−a), the bucket's own bound, exactly (TestLeaseBucketBound). The
//     margin is the price: it refills, never spent, so a bucket's lease is best
//     short (the policy requires Units + m ≤ C).
//
// What is unused when a lease ends (For after the reservation or at its window's
// end) is given back through the Refunder, with the time it was charged at, so the
// store takes it off the window it was charged to (never a later one) or gives back
// what the refill has not made up for already; units given back were never
// admitted. Until then the units are held away from the other instances: at most
// Units per instance and leased key.
//
// A request that reaches a leased limit and others (a per-client limit) stays
// all-or-nothing: its units are taken from the lease first, tentatively, the other
// limits decided in the store, and on a denial the units go back to the lease they
// came from.
//
// The deny cache is the one record of what is known locally: a reservation the
// store denies is remembered there like any denied key (with the reservation's
// cost, so it answers requests of at least that cost), and while it is remembered
// requests are decided in the store one by one, which spends the last units of the
// window exactly and, once they are gone, puts the key in the deny cache for the
// requests of any cost.

// Refunder gives back units charged in the store: cost units of every meter of c,
// charged by a decision the store made at chargedMicros (Unix µs, the store's
// clock), as redisstore's refund script does when the keys have been written since
// (memstore.Store and redisstore.Store implement it).
type Refunder interface {
	Refund(ctx context.Context, c algo.Check, chargedMicros int64) error
}

// maxLeases bounds the leases an engine holds under one policy (a leased rule
// matched on "*" has one per value); past it, limits are decided in the store.
const maxLeases = 10000

// leaseTable holds the leases of one policy, by store key.
type leaseTable struct {
	mu    sync.RWMutex
	byKey map[string]*lease
}

func newLeaseTable() *leaseTable { return &leaseTable{byKey: map[string]*lease{}} }

// lease is this instance's reservation on one key.
type lease struct {
	key         string
	meter       algo.Meter
	terms       policy.Lease
	reservation int64 // what a reservation charges: Units, and for a bucket the margin of its refill over For (policy.Lease.Margin), never given back

	mu        sync.Mutex
	gen       uint64 // counts reservations, so units go back only where they came from
	left      int64  // units reserved and not spent
	charged   int64  // the store's time of the reservation, Unix µs
	sent      int64  // our clock when the reservation was sent, Unix µs
	until     int64  // our clock from which the reservation may not be spent
	windowEnd int64  // our clock at the end of its window (window algorithms)
	reserved  algo.Decision
	refilling chan struct{} // closed when the reservation in flight is decided
	gone      bool          // dropped from the table: reserve on it no more
}

// returned is unused units of a reservation, to give back.
type returned struct {
	check   algo.Check
	charged int64
}

// leaseFor returns the lease of item it of a request of cost, or nil when it is not
// leased, the request costs more than a lease holds, or the table is full.
func (t *leaseTable) leaseFor(it Item, cost int64) *lease {
	terms := it.Lease
	if terms.Units == 0 || cost > terms.Units {
		return nil
	}
	key := it.Key
	t.mu.RLock()
	l, ok := t.byKey[key]
	t.mu.RUnlock()
	if ok {
		return l
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l, ok := t.byKey[key]; ok {
		return l
	}
	if len(t.byKey) >= maxLeases {
		return nil
	}
	l = &lease{key: key, meter: it.Meter, terms: terms}
	l.reservation = terms.Units + terms.Margin(l.meter.Limits[0])
	t.byKey[key] = l
	return l
}

// forget drops the leases of keys without giving anything back: their state in the
// store is gone (an admin reset).
func (t *leaseTable) forget(keys []string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, k := range keys {
		if l, ok := t.byKey[k]; ok {
			l.mu.Lock()
			l.left, l.gone = 0, true
			l.mu.Unlock()
			delete(t.byKey, k)
		}
	}
}

// take spends cost units at now if the reservation holds them and may be spent.
// The caller holds l.mu.
func (l *lease) take(now, cost int64) (taken, bool) {
	if l.left < cost || now < l.sent || now >= l.until {
		return taken{}, false
	}
	l.left -= cost
	d := l.reserved
	// Remaining is what this instance knows: the store's remaining after the
	// reservation (others may have spent part of it since) and what the lease holds.
	d.Remaining = min(l.meter.Limits[0].Capacity(), d.Remaining+l.left)
	d.ResetAfter = max(0, d.ResetAfter-time.Duration(now-l.sent)*time.Microsecond)
	d.RetryAfter, d.Delay = 0, 0
	return taken{l: l, gen: l.gen, cost: cost, at: now, d: d}, true
}

// detach takes the unused units of an ended or short reservation out of the lease,
// to be given back; none of a fixed_window whose window has ended (its counter has
// expired with it). The caller holds l.mu.
func (l *lease) detach(now int64) (returned, bool) {
	n := l.left
	l.left = 0
	if n == 0 || l.meter.Algorithm() == algo.FixedWindow && now >= l.windowEnd {
		return returned{}, false
	}
	c := algo.Check{Keys: []string{l.key}, Meters: []algo.Meter{l.meter}, Cost: n}
	return returned{check: c, charged: l.charged}, true
}

// granted records a reservation of the store's decision d, charged at charged
// (the store's clock) and sent at sent (ours). The caller holds l.mu.
func (l *lease) granted(d algo.Decision, sent, charged int64) {
	l.gen++
	l.left, l.reserved, l.sent, l.charged = l.terms.Units, d, sent, charged
	l.until, l.windowEnd = sent+l.terms.For.Microseconds(), int64(1<<63-1)
	lim := l.meter.Limits[0]
	if a := lim.Algorithm; a == algo.FixedWindow || a == algo.SlidingWindow {
		// The store's window ends end-charged after the charge, which came after
		// sent: counted from sent, the lease ends no later than the window.
		li := lim.In(charged)
		p := li.Period.Microseconds()
		end := (charged/p + 1) * p
		if li.WindowStartMicros != 0 {
			end = li.WindowStartMicros + p
		}
		l.windowEnd = sent + end - charged
		l.until = min(l.until, l.windowEnd)
	}
}

// taken is units a request took from a lease, tentatively until the verdict.
type taken struct {
	l    *lease
	gen  uint64
	cost int64
	at   int64 // our clock when they were taken
	i    int   // the item's index in the plan
	d    algo.Decision
}

// undo puts the units back in the reservation they came from; if it has been
// replaced since, they stay charged in the store until its window ends or its
// bucket refills, which is never more admitted.
func (t taken) undo() {
	t.l.mu.Lock()
	if t.l.gen == t.gen {
		t.l.left += t.cost
	}
	t.l.mu.Unlock()
}

// takeLease takes the request's cost from lease l of plan item i, reserving in the
// store when the lease is short or has ended. It reports false when the meter must
// be decided in the store with the request's own cost: the reservation was denied
// (now or recently: the deny cache knows), or ctx ended while another request was
// reserving. An error is the store's.
func (e *Engine) takeLease(ctx context.Context, p Plan, i int, l *lease) (taken, bool, error) {
	known := p.cur.known
	for {
		now := e.clock().UnixMicro()
		l.mu.Lock()
		if t, ok := l.take(now, p.Cost); ok {
			l.mu.Unlock()
			t.i = i
			return t, true, nil
		}
		if l.gone {
			l.mu.Unlock()
			return taken{}, false, nil
		}
		if ch := l.refilling; ch != nil {
			l.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return taken{}, false, nil
			}
		}
		if _, denied := known.denies(l.key, l.reservation, now); denied {
			l.mu.Unlock()
			return taken{}, false, nil
		}
		back, give := l.detach(now)
		ch := make(chan struct{})
		l.refilling = ch
		l.mu.Unlock()
		if give {
			e.giveBack(ctx, p.cur.pol, back)
		}
		ok, err := e.reserve(ctx, p, i, l)
		l.mu.Lock()
		l.refilling = nil
		close(ch)
		l.mu.Unlock()
		if err != nil || !ok {
			return taken{}, false, err
		}
	}
}

// reserve charges a reservation (l.reservation) on the lease's key and, when the store
// grants it, makes its units the lease's. A denial is remembered in the deny cache.
func (e *Engine) reserve(ctx context.Context, p Plan, i int, l *lease) (bool, error) {
	r := Plan{Domain: p.Domain, Cost: l.reservation, Items: []Item{p.Items[i]}, cur: p.cur}
	sent := e.clock().UnixMicro()
	out, err := e.decideInStore(ctx, p.cur.pol, r.Check())
	if err != nil {
		return false, err
	}
	if !out.Allowed {
		p.cur.known.remember(r, e.verdict(r, out), sent)
		return false, nil
	}
	charged := out.NowMicros
	if charged == 0 {
		charged = sent
	}
	l.mu.Lock()
	l.granted(out.Decisions[0][0], sent, charged)
	l.mu.Unlock()
	return true, nil
}

// decideLeased decides a plan some of whose meters lease: those from their leases,
// the others in the store, all-or-nothing. It reports false when no lease served
// the request, which is then decided as any other.
func (e *Engine) decideLeased(ctx context.Context, p Plan, now int64) (Verdict, bool) {
	var took []taken
	var rest []int
	undo := func() {
		for _, t := range took {
			t.undo()
		}
	}
	for i, it := range p.Items {
		l := p.cur.leases.leaseFor(it, p.Cost)
		if l == nil {
			rest = append(rest, i)
			continue
		}
		t, ok, err := e.takeLease(ctx, p, i, l)
		if err != nil {
			undo()
			return e.failureMode(ctx, p, now, err), true
		}
		if !ok {
			rest = append(rest, i)
			continue
		}
		took = append(took, t)
	}
	if len(took) == 0 {
		return Verdict{}, false
	}
	out := algo.Outcome{Allowed: true, NowMicros: took[len(took)-1].at, Decisions: make([][]algo.Decision, len(p.Items))}
	for _, t := range took {
		out.Decisions[t.i] = []algo.Decision{t.d}
	}
	if len(rest) > 0 {
		sub := p.subPlan(rest)
		so, err := e.decideInStore(ctx, p.cur.pol, sub.Check())
		if err != nil {
			undo()
			return e.failureMode(ctx, p, now, err), true
		}
		out.Allowed, out.NowMicros = so.Allowed, so.NowMicros
		for k, i := range rest {
			out.Decisions[i] = so.Decisions[k]
		}
		if !so.Allowed {
			undo()
		}
	}
	v := e.verdict(p, out)
	// A denial came from the store: remember it with what every item said, the
	// leased ones included, so that the deny cache can answer the whole request.
	p.cur.deny.remember(p, v, now)
	return v, true
}

// leased reports whether some item of p leases.
func (p Plan) leased() bool {
	if p.cur != nil && p.cur.leases == nil {
		return false
	}
	for _, it := range p.Items {
		if it.Lease.Units > 0 {
			return true
		}
	}
	return false
}

// subPlan returns the plan of p's items at idx.
func (p Plan) subPlan(idx []int) Plan {
	sub := p
	sub.Items = make([]Item, len(idx))
	for k, i := range idx {
		sub.Items[k] = p.Items[i]
	}
	return sub
}

// giveBack refunds unused units of a reservation through the refunder, within the
// policy's timeout even if ctx has ended. A refund that fails (or no refunder) only
// leaves the units charged until their window ends or the bucket refills.
func (e *Engine) giveBack(ctx context.Context, pol *policy.Policy, r returned) {
	if e.refunder == nil {
		return
	}
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), pol.Failure.Timeout)
	err := e.refunder.Refund(rctx, r.check, r.charged)
	cancel()
	if e.hooks.StoreCall != nil {
		e.hooks.StoreCall(time.Since(t0), err)
	}
	if err != nil {
		e.log.Warn("lease refund failed; its units come back when the window ends or the bucket refills",
			"key", r.check.Keys[0], "units", r.check.Cost, "err", err)
	}
}

// ReturnLeases gives back the unused units of every lease that has ended (For after
// its reservation, or its window's end) and forgets the leases that hold nothing,
// and returns how many reservations it gave units back from. A service calls it
// every few milliseconds, so that an instance whose traffic stopped does not hold
// its units until its next request.
func (e *Engine) ReturnLeases(ctx context.Context) int {
	return e.returnLeases(ctx, e.cur.Load(), false)
}

// EndLeases ends every lease now and gives back its unused units, and returns how
// many reservations it gave units back from: for a service that stops. Requests
// decided after it reserve anew.
func (e *Engine) EndLeases(ctx context.Context) int {
	return e.returnLeases(ctx, e.cur.Load(), true)
}

func (e *Engine) returnLeases(ctx context.Context, cur *current, all bool) int {
	if cur.leases == nil {
		return 0
	}
	now := e.clock().UnixMicro()
	ended := func(l *lease) bool { return l.refilling == nil && (all || now >= l.until) }
	// Find the ended leases under the read lock, so that a sweep that finds none
	// (most of them) does not hold up the decisions that look their leases up.
	t := cur.leases
	var done []string
	t.mu.RLock()
	for k, l := range t.byKey {
		l.mu.Lock()
		if ended(l) {
			done = append(done, k)
		}
		l.mu.Unlock()
	}
	t.mu.RUnlock()
	if len(done) == 0 {
		return 0
	}
	var backs []returned
	t.mu.Lock()
	for _, k := range done {
		l, ok := t.byKey[k]
		if !ok {
			continue
		}
		l.mu.Lock()
		if ended(l) { // still: a request may have reserved anew in between
			if back, give := l.detach(now); give {
				backs = append(backs, back)
			}
			delete(t.byKey, k)
			l.gone = true // a request holding l decides in the store
		}
		l.mu.Unlock()
	}
	t.mu.Unlock()
	for _, b := range backs {
		e.giveBack(ctx, cur.pol, b)
	}
	return len(backs)
}
