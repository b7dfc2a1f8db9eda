package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// ttlMeter draws a meter for the TTL test: periods from 1 s to 1 h, bursts above and
// below the count, bucket_rings of one to three windows, records on half the meters
// that can keep them.
func ttlMeter(r *rand.Rand, a algo.Algorithm) algo.Meter {
	periods := []time.Duration{time.Second, 2 * time.Second, 10 * time.Second, time.Minute, time.Hour}
	if a == algo.BucketRing {
		bucket := []time.Duration{100 * time.Millisecond, time.Second}[r.IntN(2)]
		var m algo.Meter
		for range 1 + r.IntN(3) {
			m.Limits = append(m.Limits, algo.Limit{Algorithm: a, Count: 1 + r.Int64N(20), Period: bucket * time.Duration(1+r.IntN(15)), Bucket: bucket})
		}
		return m
	}
	l := algo.Limit{Algorithm: a, Count: 1 + r.Int64N(20), Period: periods[r.IntN(len(periods))]}
	if a.HasBurst() && r.IntN(2) == 0 {
		l.Burst = 1 + r.Int64N(30)
	}
	m := algo.Meter{Limits: []algo.Limit{l}}
	if a.CanRecord() && r.IntN(2) == 0 {
		m.Record = fmt.Sprintf("user-%d", r.IntN(3))
	}
	return m
}

// ttlBound returns the longest TTL meter m's keys need: the period for fixed_window
// and sliding_log, two periods for sliding_window, the time to refill the whole
// capacity for token_bucket, gcra and leaky_bucket, and the longest window plus one
// bucket for bucket_ring.
func ttlBound(m algo.Meter) time.Duration {
	l := m.Limits[0]
	var d time.Duration
	switch l.Algorithm {
	case algo.FixedWindow:
		d = l.Period
		if m.Record == "" {
			d += time.Second // counted (count.go): the window's end plus a second's slack
		}
	case algo.SlidingLog:
		d = l.Period
	case algo.SlidingWindow:
		d = 2 * l.Period
	case algo.TokenBucket, algo.GCRA, algo.LeakyBucket:
		d = time.Duration(math.Ceil(float64(l.Capacity()) * float64(l.Period) / float64(l.Count)))
	case algo.BucketRing:
		for _, w := range m.Limits {
			d = max(d, w.Period)
		}
		d += m.RingBucket()
	}
	return d
}

// writtenKeys returns the keys an admitted request on meter m at now (Unix µs)
// wrote: the meter key, or fixed_window's window key and its records.
func writtenKeys(key string, m algo.Meter, now int64) []string {
	if m.Algorithm() != algo.FixedWindow {
		return []string{key}
	}
	k := fmt.Sprintf("%s:%d", key, now/m.Limits[0].Period.Microseconds())
	if m.Record != "" {
		return []string{k, k + ":r"}
	}
	return []string{k}
}

// ceilMs rounds d up to whole milliseconds.
func ceilMs(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// TestNoImmortalKeys runs thousands of random requests (every algorithm, records on,
// random costs, the server's clock) and checks every TTL: after each admitted
// request, each key it wrote expires exactly when the meter is back to full capacity
// (the decision's ResetAfter, to the millisecond: no slack is added on server time;
// a counted fixed_window request, decided on the process's clock, adds a second);
// at the end, SCAN finds no key without a TTL, and none whose TTL is longer than its
// algorithm needs.
func TestNoImmortalKeys(t *testing.T) {
	const (
		metersPerAlgo = 12
		workers       = 4
		requests      = 3000 // in all
	)
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: workers})
	t.Cleanup(func() { _ = client.Close() })
	store := loadedStore(t, client)
	ctx := context.Background()

	type entry struct {
		key string
		m   algo.Meter
	}
	r := rand.New(rand.NewPCG(1, 2))
	meters := map[string]algo.Meter{}
	var entries []entry
	for _, a := range algo.Algorithms {
		for i := range metersPerAlgo {
			m := ttlMeter(r, a)
			if err := m.Validate(); err != nil {
				t.Fatalf("meter %+v: %v", m, err)
			}
			key := algo.Key("ttl:", fmt.Sprintf("%s-%d", a, i), "r", "", "0")
			meters[key] = m
			entries = append(entries, entry{key, m})
		}
	}

	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Each worker owns every workers-th meter, so no other request moves a
			// key's TTL between a decision and its check.
			r := rand.New(rand.NewPCG(uint64(w), 7))
			var own []entry
			for i := w; i < len(entries); i += workers {
				own = append(own, entries[i])
			}
			for range requests / workers {
				e := own[r.IntN(len(own))]
				cost := int64(1)
				switch r.IntN(8) {
				case 0:
					cost = 0
				case 1:
					cost = 2 + r.Int64N(4)
				case 2:
					cost = e.m.Limits[0].Capacity() + 1 // never admissible
				}
				began := time.Now()
				o, err := store.Decide(ctx, algo.Check{Keys: []string{e.key}, Meters: []algo.Meter{e.m}, Cost: cost})
				if err != nil {
					t.Error(err)
					return
				}
				if !o.Allowed || cost == 0 {
					continue
				}
				var reset time.Duration
				for _, d := range o.Decisions[0] {
					reset = max(reset, d.ResetAfter)
				}
				want := ceilMs(reset)
				if e.m.Algorithm() == algo.FixedWindow && e.m.Record == "" && cost <= e.m.Limits[0].Count {
					// counted (count.go): on the process's clock, a second's slack
					want += time.Second.Milliseconds()
				}
				for _, k := range writtenKeys(e.key, e.m, o.NowMicros) {
					got, err := client.Do(ctx, "PTTL", k).Int64()
					if err != nil {
						t.Error(err)
						return
					}
					drift := int64(time.Since(began)/time.Millisecond) + 1
					if got > want || got < want-drift {
						t.Errorf("after Check(%v, cost %d): PTTL %s = %d ms, want %d ms (ResetAfter %v, %d ms since the decision)", e.m.Limits, cost, k, got, want, reset, drift-1)
					}
				}
			}
		}()
	}
	wg.Wait()

	keys := scanKeys(t, client, "*")
	if len(keys) == 0 {
		t.Fatal("SCAN found no keys after the run")
	}
	for _, k := range keys {
		i := strings.Index(k, "::0")
		if i < 0 {
			t.Errorf("SCAN found %q, not a key of the test", k)
			continue
		}
		m := meters[k[:i+3]]
		got, err := client.Do(ctx, "PTTL", k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		// PEXPIRE takes whole milliseconds, so the scripts round up.
		switch bound := ceilMs(ttlBound(m)); {
		case got == -1:
			t.Errorf("PTTL %s = -1 (no TTL), want at most %d ms (%v)", k, bound, m.Limits)
		case got > bound:
			t.Errorf("PTTL %s = %d ms, want at most %d ms (%v)", k, got, bound, m.Limits)
		}
	}
	t.Logf("%d requests on %d meters; SCAN found %d keys, every one with a TTL within its bound", requests, len(entries), len(keys))
}
