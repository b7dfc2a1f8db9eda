package algo_test

import (
	"fmt"
	"maps"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// base is 2023-11-14T00:00:00Z in Unix microseconds: a whole number of days, so every
// window and bucket of the tables below starts at an offset that is a multiple of its
// length.
const base int64 = 19675 * 86400 * 1_000_000

const (
	us  = time.Microsecond
	ms  = time.Millisecond
	sec = time.Second
)

// A step is one request of a step table: when it comes (after the table's start), its
// cost, and the decision the meter's only limit must give it. Limit and Period of the
// decision are the limit's own.
type step struct {
	at        time.Duration
	cost      int64
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
	delay     time.Duration
}

func (st step) String() string { return fmt.Sprintf("at %v, cost %d", st.at, st.cost) }

// A stepTable is a sequence of steps threaded through one meter's state.
type stepTable struct {
	name  string
	meter algo.Meter
	start int64 // Unix microseconds of at == 0
	steps []step
	// tolerance is how far the table's durations may be from the decisions': zero but
	// for emission intervals that are not whole microseconds, whose float TAT rounds.
	tolerance time.Duration
}

func meter(a algo.Algorithm, count int64, period time.Duration, burst int64) algo.Meter {
	return algo.Meter{Limits: []algo.Limit{{Algorithm: a, Count: count, Period: period, Burst: burst}}}
}

// cloneState returns a deep copy of st, so that a later comparison sees whether a call
// wrote through the slices or the map of st.
func cloneState(st algo.State) algo.State {
	st.Log = slices.Clone(st.Log)
	st.Buckets = slices.Clone(st.Buckets)
	st.Records = maps.Clone(st.Records)
	return st
}

// runSteps feeds the steps of tt to its meter, each on the state the previous step
// returned, and checks every decision, that a denial returns the state it was given,
// and that no call modifies its input state.
func runSteps(t *testing.T, tt stepTable) {
	t.Helper()
	if err := tt.meter.Validate(); err != nil {
		t.Fatalf("Validate() = %v, want nil", err)
	}
	l := tt.meter.Limits[0]
	var st algo.State
	for i, sp := range tt.steps {
		before := cloneState(st)
		ns, ds := tt.meter.StepMicros(st, tt.start+int64(sp.at/us), sp.cost)
		if !reflect.DeepEqual(st, before) {
			t.Fatalf("step %d: StepMicros(%v) modified its input state: %+v, want %+v", i, sp, st, before)
		}
		want := algo.Decision{Allowed: sp.allowed, Limit: l.Count, Period: l.Period, Remaining: sp.remaining,
			RetryAfter: sp.retry, ResetAfter: sp.reset, Delay: sp.delay}
		if len(ds) != 1 || !within(ds[0], want, tt.tolerance) {
			t.Fatalf("step %d: StepMicros(%v) = %+v, want [%+v]", i, sp, ds, want)
		}
		if !ds[0].Allowed && !reflect.DeepEqual(ns, before) {
			t.Fatalf("step %d: denied StepMicros(%v) returned state %+v, want the input state %+v", i, sp, ns, before)
		}
		st = ns
	}
}

// within reports whether got equals want, its durations within tol.
func within(got, want algo.Decision, tol time.Duration) bool {
	near := func(a, b time.Duration) bool { return a-b <= tol && b-a <= tol }
	return got.Allowed == want.Allowed && got.Limit == want.Limit && got.Period == want.Period &&
		got.Remaining == want.Remaining && near(got.RetryAfter, want.RetryAfter) &&
		near(got.ResetAfter, want.ResetAfter) && near(got.Delay, want.Delay)
}

func runTables(t *testing.T, tables []stepTable) {
	t.Helper()
	for _, tt := range tables {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			runSteps(t, tt)
		})
	}
}

func TestFixedWindowSteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			name:  "3/s",
			meter: meter(algo.FixedWindow, 3, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 1, allowed: true, remaining: 2, reset: sec},
				{at: 100 * ms, cost: 1, allowed: true, remaining: 1, reset: 900 * ms},
				// The limit reached exactly.
				{at: 200 * ms, cost: 1, allowed: true, remaining: 0, reset: 800 * ms},
				// Denied until the window ends; a denial consumes nothing.
				{at: 300 * ms, cost: 1, remaining: 0, retry: 700 * ms, reset: 700 * ms},
				{at: sec - us, cost: 1, remaining: 0, retry: us, reset: us},
				// The window edge: a new window, cost > 1.
				{at: sec, cost: 2, allowed: true, remaining: 1, reset: sec},
				{at: 1500 * ms, cost: 2, remaining: 1, retry: 500 * ms, reset: 500 * ms},
				{at: 1500 * ms, cost: 1, allowed: true, remaining: 0, reset: 500 * ms},
				// Cost above the count can never be admitted: RetryAfter is the period.
				{at: 1600 * ms, cost: 4, remaining: 0, retry: sec, reset: 400 * ms},
				// Cost 0 is admitted even on a full window.
				{at: 1600 * ms, cost: 0, allowed: true, remaining: 0, reset: 400 * ms},
				// Cost 0 on an empty window: nothing to reset.
				{at: 2 * sec, cost: 0, allowed: true, remaining: 3, reset: 0},
				{at: 5 * sec, cost: 4, remaining: 3, retry: sec, reset: 0},
				{at: 5 * sec, cost: 3, allowed: true, remaining: 0, reset: sec},
			},
		},
		{
			// Windows are aligned to the Unix epoch, not to the first request.
			name:  "5/10s aligned to the epoch",
			meter: meter(algo.FixedWindow, 5, 10*sec, 0),
			start: base,
			steps: []step{
				{at: 7 * sec, cost: 5, allowed: true, remaining: 0, reset: 3 * sec},
				{at: 10*sec - ms, cost: 1, remaining: 0, retry: ms, reset: ms},
				{at: 10 * sec, cost: 1, allowed: true, remaining: 4, reset: 10 * sec},
			},
		},
		{
			// floor(now/P) rounds toward minus infinity: [-1s, 0) is one window.
			name:  "before the epoch",
			meter: meter(algo.FixedWindow, 2, sec, 0),
			start: 0,
			steps: []step{
				{at: -sec, cost: 1, allowed: true, remaining: 1, reset: sec},
				{at: -us, cost: 1, allowed: true, remaining: 0, reset: us},
				{at: -us, cost: 1, remaining: 0, retry: us, reset: us},
				{at: 0, cost: 2, allowed: true, remaining: 0, reset: sec},
			},
		},
	})
}

func TestSlidingLogSteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			name:  "3/s",
			meter: meter(algo.SlidingLog, 3, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 1, allowed: true, remaining: 2, reset: sec},
				{at: 200 * ms, cost: 1, allowed: true, remaining: 1, reset: sec},
				{at: 400 * ms, cost: 1, allowed: true, remaining: 0, reset: sec},
				// The oldest entry (0) leaves at 1s; the newest (400ms) at 1.4s.
				{at: 500 * ms, cost: 1, remaining: 0, retry: 500 * ms, reset: 900 * ms},
				// Cost 2 waits for the second oldest (200ms).
				{at: 500 * ms, cost: 2, remaining: 0, retry: 700 * ms, reset: 900 * ms},
				// An entry at t counts while t > now-P: the entry at 0 is gone at 1s.
				{at: sec, cost: 1, allowed: true, remaining: 0, reset: sec},
				{at: sec, cost: 1, remaining: 0, retry: 200 * ms, reset: sec},
				// Live: 1s only.
				{at: 1500 * ms, cost: 4, remaining: 2, retry: sec, reset: 500 * ms},
				{at: 1500 * ms, cost: 2, allowed: true, remaining: 0, reset: sec},
				{at: 1500 * ms, cost: 0, allowed: true, remaining: 0, reset: sec},
				// Live: 1s, 1.5s, 1.5s.
				{at: 2*sec - us, cost: 1, remaining: 0, retry: us, reset: 500*ms + us},
				{at: 2 * sec, cost: 1, allowed: true, remaining: 0, reset: sec},
				{at: 10 * sec, cost: 0, allowed: true, remaining: 3, reset: 0},
			},
		},
		{
			name:  "5/s cost > 1",
			meter: meter(algo.SlidingLog, 5, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 3, allowed: true, remaining: 2, reset: sec},
				{at: 300 * ms, cost: 2, allowed: true, remaining: 0, reset: sec},
				// Log: 0, 0, 0, 300ms, 300ms; 4 units must leave, the 4th at 1.3s.
				{at: 600 * ms, cost: 4, remaining: 0, retry: 700 * ms, reset: 700 * ms},
				{at: sec, cost: 3, allowed: true, remaining: 0, reset: sec},
				{at: sec, cost: 6, remaining: 0, retry: sec, reset: sec},
			},
		},
	})
}

func TestSlidingWindowSteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			// estimate = prev*(P-elapsed)/P + cur; admitted while estimate+cost <= 10.
			name:  "10/s",
			meter: meter(algo.SlidingWindow, 10, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 5, allowed: true, remaining: 5, reset: 2 * sec},
				{at: 500 * ms, cost: 5, allowed: true, remaining: 0, reset: 1500 * ms},
				// cur 10: wait for the next window, until 10*(1-e)+1 <= 10, e = 100ms.
				{at: 600 * ms, cost: 1, remaining: 0, retry: 500 * ms, reset: 1400 * ms},
				// prev 10 at weight 0.9.
				{at: 1100 * ms, cost: 1, allowed: true, remaining: 0, reset: 1900 * ms},
				// 10*(1-e)+1+1 <= 10 at e = 200ms.
				{at: 1100 * ms, cost: 1, remaining: 0, retry: 100 * ms, reset: 1900 * ms},
				{at: 1200 * ms, cost: 1, allowed: true, remaining: 0, reset: 1800 * ms},
				// estimate 10*0.25 + 2 = 4.5; remaining floor(10-4.5-3) = 2.
				{at: 1750 * ms, cost: 3, allowed: true, remaining: 2, reset: 1250 * ms},
				{at: 1750 * ms, cost: 11, remaining: 2, retry: sec, reset: 1250 * ms},
				// prev 5 at weight 0.5, cur 0: full once the previous window stops weighing.
				{at: 2500 * ms, cost: 0, allowed: true, remaining: 7, reset: 500 * ms},
				// 5*(1-e)+8 <= 10 at e = 600ms.
				{at: 2500 * ms, cost: 8, remaining: 7, retry: 100 * ms, reset: 500 * ms},
				{at: 2600 * ms, cost: 8, allowed: true, remaining: 0, reset: 1400 * ms},
				// Two windows later both counters are gone.
				{at: 4 * sec, cost: 1, allowed: true, remaining: 9, reset: 2 * sec},
			},
		},
	})
}

func TestTokenBucketSteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			// Capacity 4, one token every 500ms.
			name:  "2/s burst 4",
			meter: meter(algo.TokenBucket, 2, sec, 4),
			start: base,
			steps: []step{
				{at: 0, cost: 1, allowed: true, remaining: 3, reset: 500 * ms},
				// The burst: the bucket empties at once.
				{at: 0, cost: 3, allowed: true, remaining: 0, reset: 2 * sec},
				{at: 0, cost: 1, remaining: 0, retry: 500 * ms, reset: 2 * sec},
				// Half a token refilled.
				{at: 250 * ms, cost: 1, remaining: 0, retry: 250 * ms, reset: 1750 * ms},
				{at: 500 * ms, cost: 1, allowed: true, remaining: 0, reset: 2 * sec},
				{at: 1500 * ms, cost: 2, allowed: true, remaining: 0, reset: 2 * sec},
				// Cost above the capacity can never be admitted: RetryAfter is the period.
				{at: 1500 * ms, cost: 5, remaining: 0, retry: sec, reset: 2 * sec},
				{at: 1750 * ms, cost: 0, allowed: true, remaining: 0, reset: 1750 * ms},
				// Refilled to the capacity, not beyond.
				{at: 10 * sec, cost: 1, allowed: true, remaining: 3, reset: 500 * ms},
				{at: 10 * sec, cost: 4, remaining: 3, retry: 500 * ms, reset: 500 * ms},
				{at: 10 * sec, cost: 3, allowed: true, remaining: 0, reset: 2 * sec},
			},
		},
		{
			// No burst: the capacity is the count; a token every 333333.3µs.
			name:  "3/s",
			meter: meter(algo.TokenBucket, 3, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 3, allowed: true, remaining: 0, reset: sec},
				{at: 0, cost: 1, remaining: 0, retry: 333334 * us, reset: sec},
				{at: 333334 * us, cost: 1, allowed: true, remaining: 0, reset: sec},
			},
		},
	})
}

func TestGCRASteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			// T = 500ms, burst tolerance 2T = 1s.
			name:  "2/s burst 2",
			meter: meter(algo.GCRA, 2, sec, 2),
			start: base,
			steps: []step{
				{at: 0, cost: 1, allowed: true, remaining: 1, reset: 500 * ms},
				{at: 0, cost: 1, allowed: true, remaining: 0, reset: sec},
				{at: 0, cost: 1, remaining: 0, retry: 500 * ms, reset: sec},
				// TAT 1s: the new TAT 1.5s is 1.25s ahead, 250ms too far.
				{at: 250 * ms, cost: 1, remaining: 0, retry: 250 * ms, reset: 750 * ms},
				{at: 500 * ms, cost: 1, allowed: true, remaining: 0, reset: sec},
				// TAT 1.5s is in the past at 2s; cost 2 uses the whole burst.
				{at: 2 * sec, cost: 2, allowed: true, remaining: 0, reset: sec},
				{at: 2 * sec, cost: 3, remaining: 0, retry: sec, reset: sec},
				// Cost 0 on an idle key.
				{at: 5 * sec, cost: 0, allowed: true, remaining: 2, reset: 0},
				{at: 5 * sec, cost: 1, allowed: true, remaining: 1, reset: 500 * ms},
			},
		},
		{
			// No burst: the tolerance is Count*T = the period.
			name:  "10/s",
			meter: meter(algo.GCRA, 10, sec, 0),
			start: base,
			steps: []step{
				{at: 0, cost: 10, allowed: true, remaining: 0, reset: sec},
				{at: 0, cost: 1, remaining: 0, retry: 100 * ms, reset: sec},
				// TAT 1s, new TAT 1.1s, 750ms ahead: 250ms = 2.5 units of room left.
				{at: 350 * ms, cost: 1, allowed: true, remaining: 2, reset: 750 * ms},
				{at: 350 * ms, cost: 11, remaining: 2, retry: sec, reset: 750 * ms},
			},
		},
		{
			// A burst larger than the count.
			name:  "1/s burst 3",
			meter: meter(algo.GCRA, 1, sec, 3),
			start: base,
			steps: []step{
				{at: 0, cost: 3, allowed: true, remaining: 0, reset: 3 * sec},
				{at: 0, cost: 1, remaining: 0, retry: sec, reset: 3 * sec},
				{at: sec, cost: 1, allowed: true, remaining: 0, reset: 3 * sec},
				{at: 1500 * ms, cost: 1, remaining: 0, retry: 500 * ms, reset: 2500 * ms},
			},
		},
		{
			// A burst smaller than the count: one request per T = 100ms.
			name:  "10/s burst 1",
			meter: meter(algo.GCRA, 10, sec, 1),
			start: base,
			steps: []step{
				{at: 0, cost: 1, allowed: true, remaining: 0, reset: 100 * ms},
				{at: 50 * ms, cost: 1, remaining: 0, retry: 50 * ms, reset: 50 * ms},
				{at: 100 * ms, cost: 1, allowed: true, remaining: 0, reset: 100 * ms},
			},
		},
	})
}

func TestLeakyBucketSteps(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			// Requests leave every T = 500ms; the queue holds 3 (1.5s).
			name:  "2/s queue 3",
			meter: meter(algo.LeakyBucket, 2, sec, 3),
			start: base,
			steps: []step{
				// Delays grow by T per request.
				{at: 0, cost: 1, allowed: true, remaining: 2, reset: 500 * ms, delay: 0},
				{at: 0, cost: 1, allowed: true, remaining: 1, reset: sec, delay: 500 * ms},
				{at: 0, cost: 1, allowed: true, remaining: 0, reset: 1500 * ms, delay: sec},
				// The queue is full.
				{at: 0, cost: 1, remaining: 0, retry: 500 * ms, reset: 1500 * ms},
				{at: 500 * ms, cost: 1, allowed: true, remaining: 0, reset: 1500 * ms, delay: sec},
				{at: 600 * ms, cost: 1, remaining: 0, retry: 400 * ms, reset: 1400 * ms},
				// The queue has drained.
				{at: 3 * sec, cost: 1, allowed: true, remaining: 2, reset: 500 * ms, delay: 0},
				{at: 3 * sec, cost: 4, remaining: 2, retry: sec, reset: 500 * ms},
				// A request of cost 2 waits for the one ahead of it.
				{at: 3 * sec, cost: 2, allowed: true, remaining: 0, reset: 1500 * ms, delay: 500 * ms},
			},
		},
	})
}

// A ringStep is one request of a bucket_ring table, with the decision of each window.
type ringStep struct {
	at   time.Duration
	cost int64
	want []window
}

type window struct {
	allowed   bool
	remaining int64
	retry     time.Duration
	reset     time.Duration
}

func ring(bucket time.Duration, windows ...algo.Limit) algo.Meter {
	m := algo.Meter{}
	for _, l := range windows {
		l.Algorithm = algo.BucketRing
		l.Bucket = bucket
		m.Limits = append(m.Limits, l)
	}
	return m
}

func TestBucketRingSteps(t *testing.T) {
	t.Parallel()
	tables := []struct {
		name  string
		meter algo.Meter
		steps []ringStep
	}{
		{
			// 1s buckets on a ring of 5; base is bucket 0 of the ring.
			name:  "10/1s 15/3s 20/5s",
			meter: ring(sec, algo.Limit{Count: 10, Period: sec}, algo.Limit{Count: 15, Period: 3 * sec}, algo.Limit{Count: 20, Period: 5 * sec}),
			steps: []ringStep{
				{at: 0, cost: 8, want: []window{{true, 2, 0, sec}, {true, 7, 0, 3 * sec}, {true, 12, 0, 5 * sec}}},
				// The 1s window denies; the others would allow but are not charged.
				{at: 500 * ms, cost: 3, want: []window{{false, 2, 500 * ms, 500 * ms}, {true, 7, 0, 2500 * ms}, {true, 12, 0, 4500 * ms}}},
				{at: sec, cost: 6, want: []window{{true, 4, 0, sec}, {true, 1, 0, 3 * sec}, {true, 6, 0, 5 * sec}}},
				// The 3s window denies (8+6+2 > 15) until bucket 0 leaves it at 3s.
				{at: 2 * sec, cost: 2, want: []window{{true, 10, 0, 0}, {false, 1, sec, 2 * sec}, {true, 6, 0, 4 * sec}}},
				{at: 3 * sec, cost: 2, want: []window{{true, 8, 0, sec}, {true, 7, 0, 3 * sec}, {true, 4, 0, 5 * sec}}},
				// The 5s window denies (16+5 > 20) until bucket 0 leaves it at 5s.
				{at: 3500 * ms, cost: 5, want: []window{{true, 8, 0, 500 * ms}, {true, 7, 0, 2500 * ms}, {false, 4, 1500 * ms, 4500 * ms}}},
				// Bucket 5 takes the ring slot of bucket 0.
				{at: 5 * sec, cost: 5, want: []window{{true, 5, 0, sec}, {true, 8, 0, 3 * sec}, {true, 7, 0, 5 * sec}}},
				// Every window denies; cost 11 exceeds the 1s window's count.
				{at: 5 * sec, cost: 11, want: []window{{false, 5, sec, sec}, {false, 8, 3 * sec, 3 * sec}, {false, 7, sec, 5 * sec}}},
				// Bucket 8 shares a slot with bucket 3 (2 units): a stale lap counts nothing.
				{at: 8 * sec, cost: 1, want: []window{{true, 9, 0, sec}, {true, 14, 0, 3 * sec}, {true, 14, 0, 5 * sec}}},
				// Idle longer than the ring: empty, though bucket 20 shares bucket 5's slot.
				{at: 20 * sec, cost: 10, want: []window{{true, 0, 0, sec}, {true, 5, 0, 3 * sec}, {true, 10, 0, 5 * sec}}},
				{at: 20500 * ms, cost: 1, want: []window{{false, 0, 500 * ms, 500 * ms}, {true, 5, 0, 2500 * ms}, {true, 10, 0, 4500 * ms}}},
				// The clock went back: the meter stays in bucket 20, the newest written.
				{at: 19 * sec, cost: 1, want: []window{{false, 0, 2 * sec, 2 * sec}, {true, 5, 0, 4 * sec}, {true, 10, 0, 6 * sec}}},
				// Cost 0 in the next bucket.
				{at: 21 * sec, cost: 0, want: []window{{true, 10, 0, 0}, {true, 5, 0, 2 * sec}, {true, 10, 0, 4 * sec}}},
				// The 3s window reached exactly.
				{at: 22 * sec, cost: 5, want: []window{{true, 5, 0, sec}, {true, 0, 0, 3 * sec}, {true, 5, 0, 5 * sec}}},
			},
		},
		{
			// No bucket given: the width is gcd(2s, 3s) = 1s.
			name:  "4/2s 6/3s gcd bucket",
			meter: ring(0, algo.Limit{Count: 4, Period: 2 * sec}, algo.Limit{Count: 6, Period: 3 * sec}),
			steps: []ringStep{
				{at: 0, cost: 4, want: []window{{true, 0, 0, 2 * sec}, {true, 2, 0, 3 * sec}}},
				{at: sec, cost: 1, want: []window{{false, 0, sec, sec}, {true, 2, 0, 2 * sec}}},
				{at: 2 * sec, cost: 4, want: []window{{true, 4, 0, 0}, {false, 2, sec, sec}}},
				{at: 2 * sec, cost: 2, want: []window{{true, 2, 0, 2 * sec}, {true, 0, 0, 3 * sec}}},
			},
		},
	}
	for _, tt := range tables {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if err := tt.meter.Validate(); err != nil {
				t.Fatalf("Validate() = %v, want nil", err)
			}
			var st algo.State
			for i, sp := range tt.steps {
				before := cloneState(st)
				ns, ds := tt.meter.StepMicros(st, base+int64(sp.at/us), sp.cost)
				if !reflect.DeepEqual(st, before) {
					t.Fatalf("step %d: StepMicros(at %v, cost %d) modified its input state", i, sp.at, sp.cost)
				}
				want := make([]algo.Decision, len(sp.want))
				allowed := true
				for j, w := range sp.want {
					l := tt.meter.Limits[j]
					want[j] = algo.Decision{Allowed: w.allowed, Limit: l.Count, Period: l.Period, Remaining: w.remaining, RetryAfter: w.retry, ResetAfter: w.reset}
					allowed = allowed && w.allowed
				}
				if !slices.Equal(ds, want) {
					t.Fatalf("step %d: StepMicros(at %v, cost %d) = %+v, want %+v", i, sp.at, sp.cost, ds, want)
				}
				if got := algo.Allowed(ds); got != allowed {
					t.Errorf("step %d: Allowed(%+v) = %v, want %v", i, ds, got, allowed)
				}
				if !allowed && !reflect.DeepEqual(ns, before) {
					t.Fatalf("step %d: denied StepMicros(at %v, cost %d) returned state %+v, want the input state %+v", i, sp.at, sp.cost, ns, before)
				}
				st = ns
			}
		})
	}
}

// TestBucketRingLapClears checks the stored ring after a lap: the slots of buckets that
// left the ring are cleared, not added to.
func TestBucketRingLapClears(t *testing.T) {
	t.Parallel()
	m := ring(sec, algo.Limit{Count: 100, Period: 5 * sec})
	var st algo.State
	for _, at := range []time.Duration{0, sec, 3 * sec, 7 * sec} {
		st, _ = m.StepMicros(st, base+int64(at/us), 1)
	}
	// Buckets 3 and 7 (slots 3 and 2) are in the ring; 0 and 1 have left it.
	want := algo.State{Set: true, Window: base/1e6 + 7, Buckets: []int64{0, 0, 1, 1, 0}, ExpiresMicros: base + 12e6}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("state after steps at 0, 1s, 3s, 7s = %+v, want %+v", st, want)
	}
	st, _ = m.StepMicros(st, base+20e6, 2)
	want = algo.State{Set: true, Window: base/1e6 + 20, Buckets: []int64{2, 0, 0, 0, 0}, ExpiresMicros: base + 25e6}
	if !reflect.DeepEqual(st, want) {
		t.Errorf("state after a lap = %+v, want %+v", st, want)
	}
}

// TestStepIdleCostZero checks that cost 0 on an idle key of the algorithms whose state
// can be empty keeps nothing.
func TestStepIdleCostZero(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		meter algo.Meter
	}{
		{"sliding_log", meter(algo.SlidingLog, 3, sec, 0)},
		{"gcra", meter(algo.GCRA, 3, sec, 0)},
		{"leaky_bucket", meter(algo.LeakyBucket, 3, sec, 0)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, _ := tt.meter.StepMicros(algo.State{}, base, 1)
			got, ds := tt.meter.StepMicros(st, base+10e6, 0)
			if !reflect.DeepEqual(got, algo.State{}) || !ds[0].Allowed {
				t.Errorf("StepMicros(at 10s, cost 0) = %+v, %+v, want the empty state, allowed", got, ds)
			}
		})
	}
}

// TestStepRecords checks the values a recording meter keeps with its units.
func TestStepRecords(t *testing.T) {
	t.Parallel()
	t.Run("fixed_window", func(t *testing.T) {
		t.Parallel()
		a, b := meter(algo.FixedWindow, 5, sec, 0), meter(algo.FixedWindow, 5, sec, 0)
		a.Record, b.Record = "alice", "bob"
		var st algo.State
		st, _ = a.StepMicros(st, base, 2)
		st, _ = b.StepMicros(st, base+100e3, 1)
		st, _ = a.StepMicros(st, base+200e3, 1)
		denied, _ := b.StepMicros(st, base+300e3, 2)
		if want := map[string]int64{"alice": 3, "bob": 1}; !maps.Equal(st.Records, want) || !maps.Equal(denied.Records, want) {
			t.Errorf("Records = %v, after a denial %v, want %v", st.Records, denied.Records, want)
		}
		st, _ = b.StepMicros(st, base+1e6, 1)
		if want := map[string]int64{"bob": 1}; !maps.Equal(st.Records, want) {
			t.Errorf("Records in the next window = %v, want %v", st.Records, want)
		}
	})
	t.Run("sliding_log", func(t *testing.T) {
		t.Parallel()
		a, b := meter(algo.SlidingLog, 5, sec, 0), meter(algo.SlidingLog, 5, sec, 0)
		a.Record, b.Record = "alice", "bob"
		var st algo.State
		st, _ = a.StepMicros(st, base, 2)
		st, _ = b.StepMicros(st, base+600e3, 1)
		st, _ = a.StepMicros(st, base+1100e3, 1)
		want := []algo.LogEntry{{At: base + 600e3, Value: "bob"}, {At: base + 1100e3, Value: "alice"}}
		if !slices.Equal(st.Log, want) {
			t.Errorf("Log = %v, want %v", st.Log, want)
		}
		if wantExp := base + 2100e3; st.ExpiresMicros != wantExp {
			t.Errorf("Expires = %d, want %d", st.ExpiresMicros, wantExp)
		}
	})
}

// TestStepSharesNoMemory checks that the state an admitted request returns shares no
// memory with the state it was given.
func TestStepSharesNoMemory(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		meter algo.Meter
	}{
		{"fixed_window", algo.Meter{Limits: meter(algo.FixedWindow, 10, sec, 0).Limits, Record: "r"}},
		{"sliding_log", algo.Meter{Limits: meter(algo.SlidingLog, 10, sec, 0).Limits, Record: "r"}},
		{"bucket_ring", ring(sec, algo.Limit{Count: 10, Period: 3 * sec})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, _ := tt.meter.StepMicros(algo.State{}, base, 1)
			st, _ = tt.meter.StepMicros(st, base+1000, 1)
			before := cloneState(st)
			ns, ds := tt.meter.StepMicros(st, base+2000, 1)
			if !algo.Allowed(ds) {
				t.Fatalf("StepMicros(at 2ms, cost 1) = %+v, want allowed", ds)
			}
			for i := range ns.Log {
				ns.Log[i].At, ns.Log[i].Value = -1, "x"
			}
			for i := range ns.Buckets {
				ns.Buckets[i] = -1
			}
			for k := range ns.Records {
				ns.Records[k] = -1
			}
			if ns.Records != nil {
				ns.Records["new"] = 1
			}
			if !reflect.DeepEqual(st, before) {
				t.Errorf("writing the new state changed the old one: %+v, want %+v", st, before)
			}
		})
	}
}

// TestStepTimeBackwards steps every algorithm forward, then back in time (before the
// previous requests, and before the Unix epoch): no panic, no negative numbers, and
// a denial still returns its input state.
func TestStepTimeBackwards(t *testing.T) {
	t.Parallel()
	meters := []algo.Meter{
		meter(algo.FixedWindow, 3, sec, 0),
		meter(algo.SlidingLog, 3, sec, 0),
		meter(algo.SlidingWindow, 3, sec, 0),
		meter(algo.TokenBucket, 3, sec, 0),
		meter(algo.LeakyBucket, 3, sec, 0),
		meter(algo.GCRA, 3, sec, 0),
		ring(sec, algo.Limit{Count: 3, Period: sec}, algo.Limit{Count: 5, Period: 3 * sec}),
	}
	times := []int64{base + 10e6, base + 10e6, base + 5e6, base + 10e6 - 1, base, 1, 0, -1, -3e6, base + 10e6}
	for _, m := range meters {
		t.Run(string(m.Algorithm()), func(t *testing.T) {
			t.Parallel()
			var st algo.State
			for i, now := range times {
				for _, cost := range []int64{2, 1, 0} {
					before := cloneState(st)
					ns, ds := m.StepMicros(st, now, cost)
					for _, d := range ds {
						if d.Remaining < 0 || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Delay < 0 {
							t.Errorf("step %d: StepMicros(%d, %d) = %+v, want no negative numbers", i, now, cost, d)
						}
					}
					if !algo.Allowed(ds) && !reflect.DeepEqual(ns, before) {
						t.Errorf("step %d: denied StepMicros(%d, %d) returned state %+v, want %+v", i, now, cost, ns, before)
					}
					st = ns
				}
			}
		})
	}
}

// TestGCRAFractionalInterval checks gcra and leaky_bucket where the emission interval
// T = P/Count is not a whole number of microseconds: 6/s, T = 166666.67µs. Six
// requests at one instant fill the burst tolerance 6T = 1s exactly.
func TestGCRAFractionalInterval(t *testing.T) {
	t.Parallel()
	six := []step{
		{at: 0, cost: 1, allowed: true, remaining: 5, reset: 166667 * us},
		{at: 0, cost: 1, allowed: true, remaining: 4, reset: 333334 * us},
		{at: 0, cost: 1, allowed: true, remaining: 3, reset: 500 * ms},
		{at: 0, cost: 1, allowed: true, remaining: 2, reset: 666667 * us},
		{at: 0, cost: 1, allowed: true, remaining: 1, reset: 833334 * us},
		{at: 0, cost: 1, allowed: true, remaining: 0, reset: sec},
		{at: 0, cost: 1, remaining: 0, retry: 166667 * us, reset: sec},
	}
	oneByOne := []step{
		{at: 0, cost: 1, allowed: true, remaining: 0, reset: 166667 * us},
		{at: 0, cost: 1, remaining: 0, retry: 166667 * us, reset: 166667 * us},
		{at: 166667 * us, cost: 1, allowed: true, remaining: 0, reset: 166667 * us},
		{at: sec, cost: 1, allowed: true, remaining: 0, reset: 166667 * us},
	}
	// leaky_bucket holds the k-th request for ceil((k-1)*T).
	shaped := slices.Clone(six)
	for i, d := range []time.Duration{0, 166667 * us, 333334 * us, 500 * ms, 666667 * us, 833334 * us} {
		shaped[i].delay = d
	}
	runTables(t, []stepTable{
		{name: "gcra", meter: meter(algo.GCRA, 6, sec, 0), start: base, steps: six, tolerance: us},
		{name: "leaky_bucket", meter: meter(algo.LeakyBucket, 6, sec, 0), start: base, steps: shaped, tolerance: us},
		// With a burst of 1, now+T rounds up past now+1*T: every request is denied.
		{name: "gcra burst 1", meter: meter(algo.GCRA, 6, sec, 1), start: base, steps: oneByOne, tolerance: us},
	})
}

// TestStepClockBehind checks requests dated before the state's newest write, as when
// callers with skewed clocks pass their own time to one Redis.
func TestStepClockBehind(t *testing.T) {
	t.Parallel()
	runTables(t, []stepTable{
		{
			// The bucket is empty as of 1s; refilling starts there, not at 500ms.
			name:  "token_bucket",
			meter: meter(algo.TokenBucket, 1, sec, 0),
			start: base,
			steps: []step{
				{at: sec, cost: 1, allowed: true, remaining: 0, reset: sec},
				{at: 500 * ms, cost: 1, remaining: 0, retry: 1500 * ms, reset: 1500 * ms},
				{at: 1750 * ms, cost: 1, remaining: 0, retry: 250 * ms, reset: 250 * ms},
				{at: 2 * sec, cost: 1, allowed: true, remaining: 0, reset: sec},
			},
		},
		{
			// Window 1 holds 3 units whatever a request of window 0 does; the Lua keeps
			// one key per window.
			name:  "fixed_window",
			meter: meter(algo.FixedWindow, 3, sec, 0),
			start: base,
			steps: []step{
				{at: sec, cost: 3, allowed: true, remaining: 0, reset: sec},
				{at: 900 * ms, cost: 1, allowed: true, remaining: 2, reset: 100 * ms},
				{at: 1100 * ms, cost: 1, remaining: 0, retry: 900 * ms, reset: 900 * ms},
			},
		},
		{
			name:  "gcra",
			meter: meter(algo.GCRA, 2, sec, 2),
			start: base,
			steps: []step{
				{at: sec, cost: 2, allowed: true, remaining: 0, reset: sec},
				{at: 500 * ms, cost: 1, remaining: 0, retry: sec, reset: 1500 * ms},
				{at: 1500 * ms, cost: 1, allowed: true, remaining: 0, reset: sec},
			},
		},
		{
			name:  "sliding_log",
			meter: meter(algo.SlidingLog, 2, sec, 0),
			start: base,
			steps: []step{
				{at: sec, cost: 1, allowed: true, remaining: 1, reset: sec},
				{at: 500 * ms, cost: 1, allowed: true, remaining: 0, reset: 1500 * ms},
				{at: 700 * ms, cost: 1, remaining: 0, retry: 800 * ms, reset: 1300 * ms},
				{at: 1500 * ms, cost: 1, allowed: true, remaining: 0, reset: sec},
			},
		},
	})
}

// TestSlidingWindowClockBehind checks a request dated in the window before the stored
// one: sliding_log, which sliding_window estimates, counts the 3 units of the later
// window, so the request is over the limit.
func TestSlidingWindowClockBehind(t *testing.T) {
	t.Parallel()
	for _, a := range []algo.Algorithm{algo.SlidingLog, algo.SlidingWindow} {
		m := meter(a, 3, sec, 0)
		st, _ := m.StepMicros(algo.State{}, base+1e6, 3)
		ns, ds := m.StepMicros(st, base+900e3, 3)
		if ds[0].Allowed || !reflect.DeepEqual(ns, st) {
			t.Errorf("%s: StepMicros(3 units at 1s; at 0.9s, cost 3) = %+v, state %+v, want denied, state unchanged", a, ds, ns)
		}
	}
}

// TestStepLimitLowered decides a state filled under a count of 5 with a count of 3, as
// after a policy reload that keeps the keys: every limit is over, and Remaining is 0.
func TestStepLimitLowered(t *testing.T) {
	t.Parallel()
	for _, a := range algo.Algorithms {
		tt := struct{ algorithm algo.Algorithm }{a}
		t.Run(string(tt.algorithm), func(t *testing.T) {
			t.Parallel()
			five, three := meter(tt.algorithm, 5, sec, 0), meter(tt.algorithm, 3, sec, 0)
			st, _ := five.StepMicros(algo.State{}, base, 5)
			ns, ds := three.StepMicros(st, base, 1)
			if ds[0].Allowed || ds[0].Remaining != 0 {
				t.Errorf("StepMicros(5 units of a 5/s %s, cost 1) with 3/s = allowed %v, remaining %d, want denied, remaining 0", tt.algorithm, ds[0].Allowed, ds[0].Remaining)
			}
			if !reflect.DeepEqual(ns, st) {
				t.Errorf("denied StepMicros(5 units of a 5/s %s, cost 1) with 3/s returned state %+v, want %+v", tt.algorithm, ns, st)
			}
		})
	}
}
