package rlqs

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// A share is this instance's part of one quota: the limits (store keys) that the
// rlqs rules matching a bucket reach. It holds the units taken from them in the
// store for the current window, and one ledger per bucket of a stream that reports
// it. Every grant it makes was taken in the store first.
//
// The exactness argument, per ledger (one Envoy's bucket), within one window:
//
//   - charged is what the ledger holds of the units taken in the store;
//   - allowed is what Envoy reported admitting (a lower bound, when a report
//     straddles a window: see account);
//   - pot bounds what Envoy may still admit that it has not reported: under the
//     assignment in force when its last report was sent, and under the one sent
//     since (pending, newMax), if any;
//
// and the invariant charged ≥ allowed + pot (+ newMax while pending) holds after
// every step: a new assignment is sent only once its units are charged, and only
// charged − allowed − pot − newMax is ever given back. So the admissions of all
// Envoys in a window never exceed the units taken from that window, which the store
// never lets exceed the limit. Envoy admits at most max_tokens under a token bucket
// assignment (its refill, 1 token per fill interval longer than the assignment's
// time to live, adds less than one token), and an assignment expires before its
// window ends (see ttl).
type share struct {
	srv  *Server
	key  string
	cost int64 // bytes charged to Limits.MaxBucketBytes

	mu sync.Mutex
	// plan holds the rlqs items of the latest report's plan for the share's keys.
	plan     engine.Plan
	count    int64 // the smallest limit of the items: what a window holds
	period   time.Duration
	interval time.Duration // the rules' reporting interval
	failure  policy.Failure

	window int64 // the store's window (Unix µs / period) of the units held; 0 before any
	// pushed is the last window whose grants a push sent: a report may start a
	// window before the sweep reaches it, and every other bucket still waits for
	// its grant.
	pushed int64
	// localPushed is the last window (by our clock) whose local grants a push sent
	// while the store failed (failure mode local).
	localPushed int64
	end         time.Time // the window's end on our clock, early by up to a store round trip (see startWindow)
	charged     int64     // the store's time of a take in window, Unix µs, for giving back
	pool        int64     // units taken in window and held by no ledger
	// exhausted says a take in window got less than it asked: until units come
	// back (a stream's end), a ledger's top up waits for the next window, and costs
	// no store call.
	exhausted bool
	ledgers   map[*ledger]struct{}
	// members counts ledgers, and idle is when (Unix ns) the share, without any,
	// may be dropped: a period after a bucket was last matched to it or left it.
	// The sweep reads them under the server's lock alone: a share's lock may be
	// held across a store call, and the server's must never wait for one.
	members atomic.Int64
	idle    atomic.Int64
	pushing atomic.Bool // a sweep's push of the share is under way
	board   *board      // every instance's demand
	failing bool        // the store failed, and has not answered since (logged once)
	retry   time.Time   // a failed window start is not tried again before
}

// A ledger is one stream's bucket within a share.
type ledger struct {
	st   *stream
	sh   *share
	id   *rlqspb.BucketId // its strings are parts of key (bucketKey)
	key  string           // the bucket's key within its stream
	cost int64            // bytes charged to Limits.MaxBucketBytes
	pol  *policy.Policy   // the policy the bucket was matched with
	// reshape says the policy changed the limit: the grant in force is replaced
	// at the next report, smaller if need be.
	reshape bool

	window  int64 // the share's window this ledger's counts are in
	charged int64
	allowed int64
	pot     int64
	pending bool
	newMax  int64
	carry   int64 // what assignments of the previous window may have admitted, unreported
	// local is what the grant failure mode local sent in window localWindow (Unix µs
	// / period on our clock) may still admit, and localUsed what Envoy reported
	// admitting in it while the store failed: units no store counted. A grant from
	// the store in that window charges them beside its own.
	local, localUsed int64
	localWindow      int64

	demand   float64   // requests per second, smoothed
	samples  int       // reports that measured the demand (time_elapsed of 1s or more)
	gen      uint32    // numbers assignments, so that each differs from the last
	expires  time.Time // our clock when the assignment in force expires at the latest
	inForce  bool      // an assignment of window is in force (token bucket or deny)
	last     action    // the grant in force, as sent; nil for none
	extended bool      // last has been sent again to end closer to the window's end (extend)
	reports  int       // reports since the bucket last showed a request
}

// Shaping of grants.
const (
	// ttlMargin is how much earlier than its window's end (our clock, measured
	// conservatively) an assignment must expire: the time the assignment may take to
	// reach Envoy beyond what the whole seconds of its time to live round off.
	ttlMargin = 250 * time.Millisecond
	// windowGuard is how long after a window's conservative end the share waits
	// before taking units from the next one, so that the store has surely moved on.
	windowGuard = 20 * time.Millisecond
	// fillInterval is the token bucket's fill interval in a grant: with 1 token per
	// fill, it refills less than one token over any assignment's life (an
	// assignment lives at most one window, which the policy bounds below it).
	fillInterval = 366 * 24 * time.Hour
	// smoothing weighs a new demand sample against the past.
	smoothing = 0.5
	// maxDemand bounds a bucket's demand, in times its limit's rate.
	maxDemand = 100
	// retryEvery is how often a share whose window start failed tries again.
	retryEvery = 250 * time.Millisecond
)

// account applies a report of allowed requests to the ledger: first to what
// assignments of the previous window may have admitted (carry), then to the
// assignment in force when the report was sent, and to the one sent since, which was
// in force by then (an assignment reaches Envoy within a reporting interval; a
// stream that cannot deliver one breaks).
func (l *ledger) account(allowed int64) {
	x := allowed
	fromPrev := min(x, l.carry)
	x -= fromPrev
	l.carry = 0
	if l.pending {
		// The older assignment admitted at most pot of the report; the rest came
		// from the new one.
		l.pot = max(0, l.newMax-max(0, x-l.pot))
		l.pending, l.newMax = false, 0
	} else {
		l.pot = max(0, l.pot-x)
	}
	l.allowed += x
}

// roll moves the ledger to window w: what its assignments may still admit belongs
// to the window they were charged in.
func (l *ledger) roll(w int64) {
	if l.window == w {
		return
	}
	// Only the window just before can have admitted what a report shows now: a
	// grant ends with its window.
	l.carry = 0
	if w == l.window+1 {
		l.carry = l.outstanding()
	}
	l.window, l.charged, l.allowed, l.pot, l.pending, l.newMax = w, 0, 0, 0, false, 0
	l.inForce, l.last = false, nil
}

// held is what the ledger must keep charged: what its Envoy reported and may still
// admit.
func (l *ledger) held() int64 { return l.allowed + l.outstanding() }

// outstanding is what the ledger's assignments may still admit: the one in force,
// and the one sent since, while no report has shown it arrived.
func (l *ledger) outstanding() int64 {
	if l.pending {
		return l.pot + l.newMax
	}
	return l.pot
}

// observe smooths a report's demand (requests allowed and denied per second) into
// ledger l. A bucket's first report (time_elapsed 0) says nothing of its demand:
// until one does, the ledger takes the average of the others', or alone the
// limit's whole rate.
func (sh *share) observe(l *ledger, allowed, denied uint64, elapsed time.Duration) {
	if allowed+denied == 0 {
		l.reports++
	} else {
		l.reports = 0
	}
	if elapsed < time.Second {
		if l.samples > 0 {
			return
		}
		others, n := 0.0, 0
		for o := range sh.ledgers {
			if o != l && o.samples > 0 {
				others += o.demand
				n++
			}
		}
		if n > 0 {
			l.demand = others / float64(n)
		} else {
			l.demand = float64(sh.count) / sh.period.Seconds()
		}
		return
	}
	// Counts are Envoy's, unchecked: summed as floats (no wrap), and a bucket's
	// demand counts up to maxDemand times its limit's rate, so that one report
	// cannot take the quota from every other bucket for long, nor fill the
	// instances' demand counter.
	rate := min((float64(allowed)+float64(denied))/elapsed.Seconds(), maxDemand*float64(sh.count)/sh.period.Seconds())
	if l.samples == 0 {
		l.demand = rate
	} else {
		l.demand = smoothing*rate + (1-smoothing)*l.demand
	}
	l.samples++
}

// An action is what the service tells Envoy of one bucket.
type action = *rlqspb.RateLimitQuotaResponse_BucketAction

// A decision is an action to send for one bucket (nil when the assignment in force
// stays), and the time by which a grant must expire (zero for an action that need
// not): its time to live is cut to that when it is sent, however long the report's
// other buckets took.
type decision struct {
	action action
	by     time.Time
	// fresh marks a new grant (a token bucket unlike the last): the stream sends a
	// blanket rule for the bucket just before it, in the same response, so that Envoy
	// starts the grant full (see tokenBucket).
	fresh bool
	// l and gen are the ledger decided for and its assignment's number then: a
	// decision made under the share's lock is sent after it, so the stream drops one
	// older than what it sent the bucket already (an extension decided before a
	// fresh grant but sent after it would replace the grant with the old one, which
	// Envoy would then restart).
	l   *ledger
	gen uint32
}

// report applies one bucket's usage to ledger l and returns the action to send.
func (sh *share) report(ctx context.Context, l *ledger, allowed, denied uint64, elapsed time.Duration, now time.Time) decision {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.observe(l, allowed, denied, elapsed)
	admitted := int64(min(allowed, math.MaxInt32))
	// What Envoy reports admitting is charged (below, or once the store answers),
	// and no longer left to a local grant.
	l.local = max(0, l.local-admitted)
	if sh.board.next.IsZero() {
		sh.publishDemand(ctx, now)
	}
	if sh.window == 0 || !now.Before(sh.end.Add(windowGuard)) {
		if err := sh.startWindow(ctx, now, sh.part(l, sh.totalDemand(now), sh.period)); err != nil {
			l.account(admitted)
			if l.localWindow == sh.clockWindow(now) && l.window != l.localWindow {
				// Not in the ledger's counts, which are of an earlier window.
				l.localUsed += admitted
			}
			return sh.unavailable(l, now, err)
		}
	}
	l.roll(sh.window)
	l.account(admitted)
	if deficit := l.held() - l.charged; deficit > 0 {
		// Envoy admitted requests no grant covered (its no_assignment or expired
		// behaviour): cover them from the pool, and charge the rest, never refused.
		from := min(deficit, sh.pool)
		sh.pool -= from
		l.charged += from
		if deficit > from && sh.settle(ctx, deficit-from) {
			l.charged += deficit - from
		} // else charged by the next grant's take, or tried again at the next report
	}
	d := sh.decide(ctx, l, now, 1)
	sh.flush(ctx)
	return d
}

// settle charges units Envoy admitted beyond its grants, and reports whether the
// store took them.
func (sh *share) settle(ctx context.Context, units int64) bool {
	p := sh.plan
	p.Cost = units
	if _, err := sh.srv.eng.Settle(ctx, p); err != nil {
		sh.srv.log.Warn("rlqs: charging admissions beyond the grants failed; tried again at the next report", "units", units, "err", err)
		return false
	}
	sh.srv.metrics.settled.Add(float64(units))
	return true
}

// demandOf returns the demand of every ledger of the share (requests per second).
func (sh *share) demandOf() float64 {
	d := 0.0
	for l := range sh.ledgers {
		d += l.demand
	}
	return d
}

// totalDemand is the demand of every Envoy on the share's quota, on every
// instance: this instance's now, and the others' as the demand counter last said.
func (sh *share) totalDemand(now time.Time) float64 {
	return sh.demandOf() + sh.board.others(now)
}

// publishDemand adds this instance's demand to the counter every reporting
// interval (and at once for a new share).
func (sh *share) publishDemand(ctx context.Context, now time.Time) {
	if now.Before(sh.board.next) {
		return
	}
	sh.board.next, sh.board.at = now.Add(sh.interval), now
	err := sh.board.publish(ctx, sh.srv.eng, sh.demandOf(), now)
	sh.srv.metrics.storeCall("demand", err)
	if err != nil && !sh.failing {
		sh.failing = true
		sh.srv.log.Warn("rlqs: publishing the demand failed; shares follow the fleet's demand as last known until the store answers", "err", err)
	}
}

// part is ledger l's part of a window's units: its demand's part of them (total
// is the demand of every Envoy sharing them), at most twice what its demand needs
// over left or two reporting intervals, whichever is shorter.
func (sh *share) part(l *ledger, total float64, left time.Duration) int64 {
	var part float64
	switch {
	case total > 0:
		part = float64(sh.count) * l.demand / total
	case len(sh.ledgers) > 0:
		part = float64(sh.count) / float64(len(sh.ledgers))
	}
	need := 2*l.demand*min(max(0, left), 2*sh.interval).Seconds() + 1
	return int64(math.Ceil(min(part, need)))
}

// desired is what ledger l should still be allowed to admit in the window: its part
// less what it admitted.
func (sh *share) desired(l *ledger, total float64, now time.Time) int64 {
	return max(0, sh.part(l, total, sh.end.Sub(now))-l.allowed)
}

// decide returns the action for ledger l: a new grant, or nil to keep the one in
// force. scale (at most 1) is the part of its due the ledger may have: less when a
// window's start got fewer units than every ledger's part.
// The share's window must be current (report and push see to it).
func (sh *share) decide(ctx context.Context, l *ledger, now time.Time, scale float64) decision {
	l.roll(sh.window)
	ttl := (sh.end.Sub(now) - ttlMargin).Truncate(time.Second)
	if ttl < time.Second {
		// Too close to the window's end for a whole second: the assignment in force
		// (which expires by then) stays; the next window's push answers.
		return decision{}
	}
	// Rounded up, so that the scaled parts take the whole pool (the last ledger gets
	// a few units less).
	want := int64(math.Ceil(float64(sh.desired(l, sh.totalDemand(now), now)) * scale))
	inForce := l.inForce && now.Before(l.expires)
	have := l.pot // what the assignment in force may still admit, at most
	if l.pending {
		have = l.newMax
	}
	reshape := l.reshape
	l.reshape = false
	if inForce && !reshape {
		// Top up an assignment that runs low; shrink one that holds far more than
		// its part only while the window has time for others to use it (it is
		// replaced at the window's start anyway).
		low := have < want/2
		high := have > 2*want+1 && sh.end.Sub(now) >= 3*sh.interval
		if !low && !high {
			return decision{}
		}
	}
	// Until a report shows what it admitted, the assignment in force stays held
	// beside the new one: Envoy spends it until the new one arrives. So does a grant
	// of failure mode local in this window, which no store counted: it is charged now.
	old := l.outstanding()
	var used int64
	if l.localWindow == sh.window {
		old, used = old+l.local, l.localUsed
	}
	grant := want
	if need := l.allowed + used + old + grant - l.charged; need > 0 {
		got, err := sh.take(ctx, need)
		if err != nil && !inForce {
			return sh.unavailable(l, now, err)
		}
		l.charged += got
		grant -= need - got
	}
	grant = max(0, min(grant, math.MaxUint32))
	if inForce && grant < want && grant <= have && !reshape {
		// Too few units to better the assignment in force: it stays.
		sh.release(l)
		return decision{}
	}
	l.pot, l.pending, l.newMax = old, true, grant
	l.allowed += used
	l.local, l.localUsed = 0, 0
	l.inForce = true
	l.expires = now.Add(ttl)
	sh.release(l)
	l.gen++
	sh.srv.metrics.grants.Inc()
	sh.srv.metrics.granted.Add(float64(grant))
	if grant == 0 {
		l.last = blanket(l.id, typev3.RateLimitStrategy_DENY_ALL, ttl)
	} else {
		l.last = tokenBucket(l.id, grant, l.gen, ttl)
	}
	l.extended = false
	return decision{action: l.last, by: sh.end.Add(-ttlMargin), fresh: grant > 0, l: l, gen: l.gen}
}

// release moves what ledger l holds beyond what its Envoy reported and may still
// admit to the pool.
func (sh *share) release(l *ledger) {
	if surplus := l.charged - l.held(); surplus > 0 {
		l.charged -= surplus
		sh.pool += surplus
	}
}

// take returns up to units for a ledger: from the pool, else from the store.
func (sh *share) take(ctx context.Context, units int64) (int64, error) {
	got := min(units, sh.pool)
	sh.pool -= got
	if got == units || sh.exhausted {
		return got, nil
	}
	sent := sh.srv.clock()
	t, err := sh.srv.eng.Take(ctx, sh.plan, min(units-got, sh.count))
	sh.srv.metrics.storeCall("take", err)
	if err != nil {
		return got, err
	}
	if w := t.Verdict.NowMicros / sh.period.Microseconds(); w != sh.window {
		// The store has moved to the next window before our clock said: these
		// units are not this window's. Give them back; the push grants the next.
		sh.giveBack(ctx, t.Units, t.Verdict.NowMicros)
		return got, nil
	}
	if end, ok := windowEnd(t.Verdict, sent); ok && end.Before(sh.end) {
		sh.end = end
	}
	if t.Units < min(units-got, sh.count) {
		sh.exhausted = true
	}
	if sh.charged == 0 {
		sh.charged = t.Verdict.NowMicros
	}
	return got + t.Units, nil
}

// windowEnd returns when the window of the limits a take decided ends on our clock:
// reset after the store's time, which came after sent, so sent + reset is early,
// never late. ok is false when no limit says (a window the take left empty).
func windowEnd(v engine.Verdict, sent time.Time) (end time.Time, ok bool) {
	for _, lr := range v.Limits {
		if lr.ResetAfter > 0 && (!ok || sent.Add(lr.ResetAfter).Before(end)) {
			end, ok = sent.Add(lr.ResetAfter), true
		}
	}
	return end, ok
}

// startWindow moves the share to the store's current window, taking want units
// into the pool (0: one unit, to learn the window). The units held for the previous
// window are lost with it: they were charged to it.
func (sh *share) startWindow(ctx context.Context, now time.Time, want int64) error {
	sent := sh.srv.clock()
	t, err := sh.srv.eng.Take(ctx, sh.plan, min(max(want, 1), sh.count))
	sh.srv.metrics.storeCall("take", err)
	if err != nil {
		return err
	}
	w := t.Verdict.NowMicros / sh.period.Microseconds()
	end, ok := windowEnd(t.Verdict, sent)
	if !ok {
		// Nothing taken from an empty window: it ends at the latest at the next
		// multiple of the period after the store's time.
		end = sent.Add(time.Duration((w+1)*sh.period.Microseconds()-t.Verdict.NowMicros) * time.Microsecond)
	}
	sh.end = end
	if sh.failing {
		sh.failing = false
		sh.srv.log.Info("rlqs: the store answers again")
	}
	if w != sh.window {
		sh.window, sh.pool, sh.charged, sh.exhausted = w, 0, t.Verdict.NowMicros, false
	}
	if t.Units < min(max(want, 1), sh.count) {
		sh.exhausted = true
	}
	sh.pool += t.Units
	return nil
}

// flush gives the pool's units back to the store, for every instance to take.
func (sh *share) flush(ctx context.Context) {
	if sh.pool > 0 {
		sh.giveBack(ctx, sh.pool, sh.charged)
		sh.pool = 0
	}
}

func (sh *share) giveBack(ctx context.Context, units, charged int64) {
	err := sh.srv.eng.GiveBack(ctx, sh.plan, units, charged)
	sh.srv.metrics.storeCall("give_back", err)
	if err != nil {
		sh.srv.log.Warn("rlqs: giving back unused units failed; they stay charged until the window ends", "units", units, "err", err)
	}
}

// unavailable is the action for a ledger with no assignment in force when the store
// cannot be reached: the policy's failure mode, for one reporting interval.
func (sh *share) unavailable(l *ledger, now time.Time, err error) decision {
	if !sh.failing {
		sh.failing = true
		sh.srv.log.Warn("rlqs: the store failed; buckets without a grant in force get the failure mode until it answers", "mode", string(sh.failure.Mode), "err", err)
	}
	sh.srv.metrics.failureMode.WithLabelValues(string(sh.failure.Mode)).Inc()
	if l.inForce && now.Before(l.expires) {
		return decision{} // the grant in force stays until it expires
	}
	ttl := sh.interval
	switch sh.failure.Mode {
	case policy.FailClosed:
		return decision{action: blanket(l.id, typev3.RateLimitStrategy_DENY_ALL, ttl), l: l, gen: l.gen}
	case policy.FailLocal:
		// A local grant ends by its window's end on our clock, as a grant from the
		// store does, so that it counts in one window only; too close to the end for a
		// whole second, none is sent (Envoy's fallback applies until the next report).
		w := sh.clockWindow(now)
		end := time.UnixMicro((w + 1) * sh.period.Microseconds())
		left := end.Sub(now) - ttlMargin
		ttl = min(ttl, left.Truncate(time.Second))
		if ttl < time.Second {
			return decision{}
		}
		if w != l.localWindow {
			l.localUsed = 0
		}
		// Each bucket's part of the window, N / (expected instances × this instance's
		// buckets), at the window's rate for the grant's life; the last grant the
		// window has room for (the next report comes too late for a whole second) gets
		// what is left of the part.
		n := max(1, int64(sh.failure.ExpectedInstances)) * max(1, int64(len(sh.ledgers)))
		used := l.localUsed
		if l.window == w {
			used += l.allowed
		}
		rest := max(0, sh.count/n-used)
		per := max(1, int64(float64(sh.count)*ttl.Seconds()/sh.period.Seconds()/float64(n)))
		if left-sh.interval < time.Second {
			per = rest
		}
		per = min(per, rest, math.MaxUint32)
		l.local, l.localWindow = per, w
		l.gen++
		if per == 0 {
			return decision{action: blanket(l.id, typev3.RateLimitStrategy_DENY_ALL, ttl), l: l, gen: l.gen}
		}
		return decision{action: tokenBucket(l.id, per, l.gen, ttl), by: end.Add(-ttlMargin), fresh: true, l: l, gen: l.gen}
	default:
		return decision{action: blanket(l.id, typev3.RateLimitStrategy_ALLOW_ALL, ttl), l: l, gen: l.gen}
	}
}

// leave removes ledger l from the share and gives back what it holds of the
// window's units beyond what its Envoy reported and may still admit (its grant
// stays charged: the Envoy may spend it until it expires), or with all, everything
// its Envoy did not report admitting: Envoy closed its stream (it is going away),
// or was told to abandon the bucket (which erases the grant).
func (sh *share) leave(ctx context.Context, l *ledger, now time.Time, all bool) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	delete(sh.ledgers, l)
	sh.members.Add(-1)
	sh.idle.Store(now.Add(sh.period).UnixNano())
	if l.window == sh.window && sh.window != 0 {
		keep := l.held()
		if all {
			keep = l.allowed
		}
		if unused := l.charged - keep; unused > 0 {
			sh.pool += unused
			sh.exhausted = false // others may take them
		}
	}
	l.charged = 0
	sh.flush(ctx)
	if int64(l.demand*milli) > 0 && sh.board.published > 0 {
		// Take the departed Envoy's demand out of this instance's at once, so that
		// every instance's next window gives its part to the others.
		sh.board.next = time.Time{}
		sh.publishDemand(ctx, now)
	}
}

// push starts a window for every ledger whose Envoy has demand: it takes their
// units at once and returns the actions to send, by stream.
func (sh *share) push(ctx context.Context, now time.Time) map[*stream][]decision {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.ledgers) > 0 {
		sh.publishDemand(ctx, now)
	}
	if len(sh.ledgers) == 0 || sh.window == 0 {
		return nil
	}
	current := now.Before(sh.end.Add(windowGuard))
	if current && sh.pushed == sh.window {
		return sh.extend(now)
	}
	start := sh.end // the window to push starts where the last one ended
	if current {
		start = sh.end.Add(-sh.period) // a report started it
	}
	if sh.board.at.Before(start) {
		// The window's parts follow the fleet's demand as of its start: every
		// instance publishes its own then (which starts the counter's new window
		// when it turns), and reads the others'.
		sh.board.next = time.Time{}
		sh.publishDemand(ctx, now)
	}
	total := sh.totalDemand(now)
	if sh.demandOf() == 0 {
		if current {
			sh.pushed = sh.window // nothing to push in it
		}
		return nil
	}
	var want int64
	for l := range sh.ledgers {
		if current && l.window == sh.window && l.inForce {
			continue // granted already, at a report that started the window
		}
		want += sh.part(l, total, sh.period)
	}
	if now.Before(sh.retry) {
		return nil
	}
	// A window a report started holds that bucket's part only: the others' are
	// taken here, as at a window's start.
	if err := sh.startWindow(ctx, now, want); err != nil {
		if !sh.failing {
			sh.failing = true
			sh.srv.log.Warn("rlqs: starting a window failed; grants in force expire, then the policy's failure mode applies, until the store answers", "err", err)
		}
		sh.retry = now.Add(retryEvery)
		return sh.pushLocal(now, err)
	}
	sh.pushed = sh.window
	// When the store had fewer units than the parts (the other instances took theirs
	// first, on a view of the fleet's demand that differs from this one's), every
	// ledger gets the same fraction of its part, rather than the first ones all of
	// theirs and the last nothing.
	scale := 1.0
	if want > 0 && sh.pool < want {
		scale = float64(sh.pool) / float64(want)
	}
	out := map[*stream][]decision{}
	for l := range sh.ledgers {
		if l.demand == 0 {
			continue // an idle bucket is answered at its next report
		}
		if d := sh.decide(ctx, l, now, scale); d.action != nil {
			out[l.st] = append(out[l.st], d)
		}
	}
	sh.flush(ctx)
	return out
}

// clockWindow is the number of the share's window at now on our clock (Unix µs /
// period), as the store numbers its own by its clock.
func (sh *share) clockWindow(now time.Time) int64 { return now.UnixMicro() / sh.period.Microseconds() }

// pushLocal starts a window, by our clock, for every ledger whose Envoy has demand
// and no grant when the store fails under failure mode local: its local grant, at
// the window's start as a grant from the store would be (a report late in a window
// has no room left for a grant of a whole second). Once a window.
func (sh *share) pushLocal(now time.Time, err error) map[*stream][]decision {
	w := sh.clockWindow(now)
	if sh.failure.Mode != policy.FailLocal || w == sh.localPushed {
		return nil
	}
	sh.localPushed = w
	out := map[*stream][]decision{}
	for l := range sh.ledgers {
		if l.demand == 0 || l.localWindow == w {
			continue // idle, or granted at a report already
		}
		if d := sh.unavailable(l, now, err); d.action != nil {
			out[l.st] = append(out[l.st], d)
		}
	}
	return out
}

// extend sends again, a little over a second before the window ends, every grant
// in force that would expire earlier than it needs to: the same assignment, so that
// Envoy keeps its token bucket as it is, with a time to live of 1s, which now ends
// closer to the window's end than the whole seconds of the first could. Without it a
// grant expires up to a second before its window ends, and Envoy falls back to its
// expired_assignment_behavior until the next window's push.
func (sh *share) extend(now time.Time) map[*stream][]decision {
	left := sh.end.Sub(now) - ttlMargin
	if left <= time.Second || left > time.Second+2*sweepEvery {
		return nil
	}
	var out map[*stream][]decision
	for l := range sh.ledgers {
		if l.last == nil || l.extended || !l.inForce || l.window != sh.window || !l.expires.Before(now.Add(time.Second)) {
			continue
		}
		a := proto.Clone(l.last).(action)
		a.GetQuotaAssignmentAction().AssignmentTimeToLive = durationpb.New(time.Second)
		l.expires, l.extended = now.Add(time.Second), true
		if out == nil {
			out = map[*stream][]decision{}
		}
		out[l.st] = append(out[l.st], decision{action: a, by: sh.end.Add(-ttlMargin), l: l, gen: l.gen})
	}
	return out
}

// blanket is an assignment of a blanket rule.
func blanket(id *rlqspb.BucketId, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration) action {
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl)
}

// tokenBucket is a grant of units: a token bucket of units that refills less than
// one token in its life. Envoy keeps a token bucket's state when an assignment equal
// to the last arrives, comparing max_tokens, tokens_per_fill and the nanos of
// fill_interval only, and rates it in whole seconds of fill_interval; the nanos carry
// gen, so that every grant differs from the last, without changing the rate. A
// changed token bucket starts with the ratio of remaining to maximum tokens of the
// one it replaces (Envoy since 1.33), so an Envoy that spent its grant would start the
// next one empty; a bucket that holds no token bucket starts it full. So a fresh
// grant follows a blanket rule for the same bucket in the same response (stream.send):
// Envoy applies a response's actions in order and publishes the result once, so no
// request sees the blanket rule.
func tokenBucket(id *rlqspb.BucketId, units int64, gen uint32, ttl time.Duration) action {
	fill := durationpb.New(fillInterval)
	fill.Nanos = int32(1 + gen%999_999_999)
	return assignment(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens:     uint32(units),
		TokensPerFill: wrapperspb.UInt32(1),
		FillInterval:  fill,
	}}}, ttl)
}

func assignment(id *rlqspb.BucketId, s *typev3.RateLimitStrategy, ttl time.Duration) action {
	return &rlqspb.RateLimitQuotaResponse_BucketAction{
		BucketId: id,
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl.Truncate(time.Second)),
				RateLimitStrategy:    s,
			},
		},
	}
}
