package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// sequences is how many random sequences each algorithm runs through both the Go
// model and the Lua script.
const sequences = 1000

// randomLimit draws a limit of algorithm a with small numbers, so sequences reach the
// limit, the window edges and the refill often.
func randomLimit(r *rand.Rand, a algo.Algorithm) algo.Limit {
	periods := []time.Duration{time.Millisecond, 7 * time.Millisecond, 100 * time.Millisecond, time.Second, 3 * time.Second, time.Minute}
	l := algo.Limit{Algorithm: a, Count: 1 + r.Int64N(12), Period: periods[r.IntN(len(periods))]}
	if a.HasBurst() && r.IntN(2) == 0 {
		l.Burst = 1 + r.Int64N(20)
	}
	if a == algo.GCRA || a == algo.TokenBucket || a == algo.LeakyBucket {
		for l.Period/time.Microsecond < time.Duration(l.Count) {
			l.Period *= 10
		}
	}
	return l
}

// randomMeter draws a meter; a bucket_ring gets one to three windows on one bucket.
func randomMeter(r *rand.Rand, a algo.Algorithm) algo.Meter {
	if a != algo.BucketRing {
		m := algo.Meter{Limits: []algo.Limit{randomLimit(r, a)}}
		if a.CanRecord() && r.IntN(2) == 0 {
			m.Record = fmt.Sprintf("user-%d", r.IntN(3))
		}
		return m
	}
	bucket := []time.Duration{time.Millisecond, 10 * time.Millisecond, time.Second}[r.IntN(3)]
	var m algo.Meter
	for range 1 + r.IntN(3) {
		m.Limits = append(m.Limits, algo.Limit{Algorithm: a, Count: 1 + r.Int64N(15), Period: bucket * time.Duration(1+r.IntN(15)), Bucket: bucket})
	}
	return m
}

// step draws the time to the next request: often none or a little, sometimes across
// a window edge, sometimes far beyond every period.
func step(r *rand.Rand, period time.Duration) int64 {
	p := int64(period / time.Microsecond)
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return r.Int64N(100)
	case 2:
		return r.Int64N(max(1, p/4))
	case 3:
		return r.Int64N(max(1, p))
	case 4:
		return p - r.Int64N(3) + r.Int64N(3)
	default:
		return r.Int64N(3 * max(1, p))
	}
}

func near(a, b time.Duration) bool {
	d := a - b
	return d <= time.Millisecond && d >= -time.Millisecond
}

func sameDecision(a, b algo.Decision) bool {
	return a.Allowed == b.Allowed && a.Remaining == b.Remaining && a.Limit == b.Limit &&
		near(a.RetryAfter, b.RetryAfter) && near(a.ResetAfter, b.ResetAfter) && near(a.Delay, b.Delay)
}

// TestConformance runs random sequences of (time step, cost) through the Go model
// (memstore) and the Lua script (real Redis) and requires identical decisions:
// allowed and remaining exactly, retry-after, reset-after and delay within 1 ms.
func TestConformance(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := time.Now().UnixMicro()
	for _, a := range algo.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			decisions := 0
			for seq := range sequences {
				seed := uint64(seq)*7919 + uint64(len(a))
				r := rand.New(rand.NewPCG(seed, uint64(seq)))
				m := randomMeter(r, a)
				if err := m.Validate(); err != nil {
					t.Fatalf("seed %d: meter %+v: %v", seed, m, err)
				}
				ms := memstore.New(0, nil)
				key := algo.Key("conf:", fmt.Sprintf("%s-%d", a, seq), "r", "", "0")
				// A third of the sequences decide the meter alone; a third with a
				// second meter of the same algorithm, shadow half the time; a third
				// add a sliding_log meter that never denies.
				keys, meters := []string{key}, []algo.Meter{m}
				if seq%3 != 0 {
					m2 := randomMeter(r, a)
					m2.Shadow = r.IntN(2) == 0
					keys = append(keys, algo.Key("conf:", fmt.Sprintf("%s-%d", a, seq), "r", "", "1"))
					meters = append(meters, m2)
				}
				if r.IntN(4) == 0 {
					meters[0].Shadow = true
				}
				if seq%3 == 2 {
					keys = append(keys, algo.Key("conf:", fmt.Sprintf("%s-%d", a, seq), "r", "", "2"))
					meters = append(meters, algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: algo.MaxLogCount, Period: time.Hour}}})
				}
				now := base + r.Int64N(int64(time.Hour/time.Microsecond))
				for i := range 10 + r.IntN(30) {
					now += step(r, m.Limits[0].Period)
					cost := int64(1)
					if r.IntN(4) == 0 {
						cost = r.Int64N(5)
					}
					c := algo.Check{Keys: keys, Meters: meters, Cost: cost, NowMicros: now}
					want, err := ms.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					got, err := rs.Decide(ctx, c)
					if err != nil {
						t.Fatalf("seed %d step %d: redis: %v", seed, i, err)
					}
					decisions++
					if got.Allowed != want.Allowed {
						t.Fatalf("seed %d step %d (%v, now %d, cost %d): allowed lua %v, model %v\nlua   %+v\nmodel %+v", seed, i, meters, now, cost, got.Allowed, want.Allowed, got.Decisions, want.Decisions)
					}
					for mi := range want.Decisions {
						for j := range want.Decisions[mi] {
							if !sameDecision(got.Decisions[mi][j], want.Decisions[mi][j]) {
								t.Fatalf("seed %d step %d (%v, now %d, cost %d): meter %d limit %d\nlua   %+v\nmodel %+v", seed, i, meters, now, cost, mi, j, got.Decisions[mi][j], want.Decisions[mi][j])
							}
						}
					}
				}
			}
			t.Logf("%s: %d sequences, %d identical decisions", a, sequences, decisions)
		})
	}
}
