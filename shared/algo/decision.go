package algo

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// A Decision is the answer of one limit to one request. Being over the limit is a
// Decision with Allowed false, never an error.
type Decision struct {
	Allowed bool
	// Limit is the limit's count per period (the quota, q in the RateLimit headers).
	Limit int64
	// Period is the limit's period (the window, w in the RateLimit headers).
	Period time.Duration
	// Remaining is how many more cost units the limit would admit now, after this
	// request if it was admitted.
	Remaining int64
	// ResetAfter is the time until the limit is back to its full capacity.
	ResetAfter time.Duration
	// RetryAfter is, on a denial, the time until the same request would be admitted
	// (zero when allowed). A request whose cost exceeds the limit's capacity can never
	// be admitted; its RetryAfter is the limit's period.
	RetryAfter time.Duration
	// Delay is, for leaky_bucket, how long to hold the admitted request before
	// forwarding it (traffic shaping). Zero for every other algorithm.
	Delay time.Duration
}

// A Meter is what one key in the store decides on: a single limit, or the windows of a
// bucket_ring that share one key. It is the unit of the Lua script's arguments and of
// the Go model's state.
type Meter struct {
	// Limits holds one limit, or several bucket_ring limits (windows) with the same
	// bucket width.
	Limits []Limit
	// Record is a value kept with each admitted request (sliding_log and fixed_window
	// only); empty for none.
	Record string
	// Shadow meters are decided and charged when they allow, but never deny a request.
	Shadow bool
	// Replicas asks the store to have the meter's charge acknowledged by replicas
	// before it answers; the zero value asks for none.
	Replicas Replicas
}

// Replicas asks a store to have a decision's writes acknowledged by Count replicas
// of the node that made them, waiting at most Timeout, before the decision is
// answered (Redis WAIT). It narrows what a failover can lose: a charge whose
// acknowledgement came is on a replica when the master dies. When fewer replicas
// acknowledge in time, the charge stands on the master and so does the decision;
// the store counts the shortfall. The zero value asks for nothing.
type Replicas struct {
	Count   int           // replicas that must acknowledge; 0 for none
	Timeout time.Duration // the longest the node waits for them, in whole milliseconds
}

// Replicas returns what the meters of c ask of replicas together: the most
// replicas and the longest timeout any of them asks for.
func (c Check) Replicas() Replicas {
	var r Replicas
	for _, m := range c.Meters {
		r.Count = max(r.Count, m.Replicas.Count)
		r.Timeout = max(r.Timeout, m.Replicas.Timeout)
	}
	return r
}

// Validate reports whether the meter can be decided: at least one limit, every limit
// valid, several limits only for a bucket_ring, Record only where it can be kept.
func (m Meter) Validate() error {
	if len(m.Limits) == 0 {
		return errors.New("algo: meter has no limits")
	}
	for i, l := range m.Limits {
		if err := l.Validate(); err != nil {
			return fmt.Errorf("algo: limit %d: %w", i, err)
		}
		if l.Algorithm != m.Limits[0].Algorithm {
			return fmt.Errorf("algo: limit %d: a meter's limits share one algorithm, got %s and %s", i, m.Limits[0].Algorithm, l.Algorithm)
		}
	}
	a := m.Limits[0].Algorithm
	if len(m.Limits) > 1 && a != BucketRing {
		return fmt.Errorf("algo: only bucket_ring meters hold several limits, %s has %d", a, len(m.Limits))
	}
	if m.Record != "" && !a.CanRecord() {
		return fmt.Errorf("algo: record: %s cannot keep recorded values; use sliding_log or fixed_window", a)
	}
	if a == BucketRing {
		w := m.RingBucket()
		for i, l := range m.Limits {
			if l.Period%w != 0 {
				return fmt.Errorf("algo: limit %d: bucket_ring period %s is not a multiple of the bucket %s", i, l.Period, w)
			}
			if l.Period/w > MaxRingBuckets {
				return fmt.Errorf("algo: limit %d: bucket_ring period %s spans more than %d buckets of %s", i, l.Period, MaxRingBuckets, w)
			}
		}
	}
	return nil
}

// Algorithm returns the algorithm of the meter's limits.
func (m Meter) Algorithm() Algorithm { return m.Limits[0].Algorithm }

// RingBucket returns the bucket width of a bucket_ring meter: the largest Bucket set on
// its limits, or else the greatest common divisor of their periods.
func (m Meter) RingBucket() time.Duration {
	var w time.Duration
	for _, l := range m.Limits {
		if l.Bucket > w {
			w = l.Bucket
		}
	}
	if w > 0 {
		return w
	}
	for _, l := range m.Limits {
		w = gcd(w, l.Period)
	}
	return w
}

func gcd(a, b time.Duration) time.Duration {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// A LogEntry is one admitted cost unit of a sliding_log.
type LogEntry struct {
	At    int64  // admission time, Unix microseconds
	Value string // the recorded value, if the meter records one
}

// State is the stored state of one meter in the in-process store and the Go models.
// The zero value is the empty state (a key that does not exist). Each algorithm uses
// the fields its documentation names; the Lua scripts keep the same numbers in Redis.
type State struct {
	// Set reports whether the key exists.
	Set bool
	// Window is the current window index (fixed_window, sliding_window) or the last
	// bucket written (bucket_ring).
	Window int64
	// Count is the current window's count (fixed_window, sliding_window).
	Count int64
	// Prev is the previous window's count (sliding_window).
	Prev int64
	// Tokens is the number of tokens left at Time (token_bucket).
	Tokens float64
	// Time is the last refill (token_bucket) or the theoretical arrival time (gcra,
	// leaky_bucket), in Unix microseconds.
	Time float64
	// Log holds a sliding_log's admitted units, oldest first.
	Log []LogEntry
	// Buckets holds a bucket_ring's counts, indexed by bucket number modulo its length.
	Buckets []int64
	// Records counts the recorded values of a fixed_window's current window.
	Records map[string]int64
	// ExpiresMicros is when the state becomes equal to the empty state, in Unix
	// microseconds: the key's TTL in Redis.
	ExpiresMicros int64
}

// Step decides one request of cost units on meter m, in state s, at now. It returns
// the decisions (one per limit of the meter) and the state to store if the request is
// charged. s is not modified; an admitting step's new state shares no memory with it,
// a denying step returns s itself.
func (m Meter) Step(s State, now time.Time, cost int64) (State, []Decision) {
	return m.StepMicros(s, now.UnixMicro(), cost)
}

// StepMicros is Step with the time given in Unix microseconds, the unit the scripts use.
func (m Meter) StepMicros(s State, now int64, cost int64) (State, []Decision) {
	return m.step(s, now, cost, false)
}

// step decides cost units on m; with force the units are charged even when a limit
// denies (a settlement), and the state returned holds them.
func (m Meter) step(s State, now int64, cost int64, force bool) (State, []Decision) {
	l := m.Limits[0]
	switch l.Algorithm {
	case FixedWindow:
		ns, d := fixedWindow(l, s, now, cost, m.Record, force)
		return ns, []Decision{d}
	case SlidingLog:
		ns, d := slidingLog(l, s, now, cost, m.Record)
		return ns, []Decision{d}
	case SlidingWindow:
		ns, d := slidingWindow(l, s, now, cost, force)
		return ns, []Decision{d}
	case TokenBucket:
		ns, d := tokenBucket(l, s, now, cost, force)
		return ns, []Decision{d}
	case GCRA:
		ns, d := gcra(l, s, now, cost, false, force)
		return ns, []Decision{d}
	case LeakyBucket:
		ns, d := gcra(l, s, now, cost, true, force)
		return ns, []Decision{d}
	case BucketRing:
		return bucketRing(m, s, now, cost, force)
	}
	return s, []Decision{{Limit: l.Count, Period: l.Period}}
}

// ErrCannotSettle is the error of a settlement on a meter whose algorithm cannot hold
// a debt (see Algorithm.CanSettle).
var ErrCannotSettle = errors.New("algo: sliding_log cannot settle: it keeps one entry per unit, so a debt would grow its log past the limit without bound; use sliding_window (or fixed_window, token_bucket, gcra) for a limit that settles")

// Settle charges a cost already spent (a settlement): the units land even when they
// take a limit past its count, leaving a debt that later requests pay back as the
// algorithm's arithmetic gives units back (see Algorithm.CanSettle). It returns the
// state holding the charge and one decision per limit, each Allowed (the charge
// landed), with Remaining and ResetAfter read after the charge: a limit in debt has
// Remaining 0 and a ResetAfter that counts until the debt is paid and the limit is
// full again. RetryAfter and Delay are zero. It fails with ErrCannotSettle for a
// sliding_log meter.
func (m Meter) Settle(s State, now time.Time, cost int64) (State, []Decision, error) {
	return m.SettleMicros(s, now.UnixMicro(), cost)
}

// SettleMicros is Settle with the time given in Unix microseconds.
func (m Meter) SettleMicros(s State, now int64, cost int64) (State, []Decision, error) {
	if !m.Algorithm().CanSettle() {
		return s, nil, ErrCannotSettle
	}
	ns, _ := m.step(s, now, cost, true)
	if cost == 0 {
		ns = s
	}
	// What the limit says after the charge: a peek (cost 0) at the new state.
	_, ds := m.step(ns, now, 0, false)
	for i := range ds {
		ds[i].Allowed, ds[i].RetryAfter, ds[i].Delay = true, 0, 0
	}
	return ns, ds, nil
}

// Allowed reports whether every decision allows.
func Allowed(ds []Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// micros returns d in whole microseconds.
func micros(d time.Duration) int64 { return int64(d / time.Microsecond) }

// us converts a whole number of microseconds to a Duration.
func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// ceilUs rounds a non-negative microsecond amount up to a whole microsecond, as the
// scripts do with math.ceil; negative amounts become zero.
func ceilUs(x float64) time.Duration {
	if x <= 0 {
		return 0
	}
	return us(int64(math.Ceil(x)))
}

// floorDiv divides rounding toward negative infinity.
func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}
