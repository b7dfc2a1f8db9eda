package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// reloaded decides cost units for a request with attrs under the policy written
// as doc, at now, on the Lua script (real Redis) and on the Go model, and requires
// both to answer the same; it returns the first meter's first decision.
func reloaded(t *testing.T, stores [2]decider, doc string, attrs map[string]string, cost, now int64) (bool, algo.Decision) {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	ms := p.Match(attrs)
	if len(ms) != 1 {
		t.Fatalf("Match(%v) = %d rules, want 1", attrs, len(ms))
	}
	c := algo.Check{Cost: cost, NowMicros: now}
	for _, mm := range ms[0].Meters {
		c.Keys, c.Meters = append(c.Keys, mm.Key), append(c.Meters, mm.Meter)
	}
	var outs [2]algo.Outcome
	for i, s := range stores {
		if outs[i], err = s.Decide(context.Background(), c); err != nil {
			t.Fatalf("Decide(%v, cost %d) = %v", c.Meters, cost, err)
		}
	}
	lua, model := outs[0], outs[1]
	if lua.Allowed != model.Allowed || !sameDecision(lua.Decisions[0][0], model.Decisions[0][0]) {
		t.Fatalf("Decide(%v, cost %d): lua %v %+v, model %v %+v", c.Meters, cost, lua.Allowed, lua.Decisions, model.Allowed, model.Decisions)
	}
	return lua.Allowed, lua.Decisions[0][0]
}

// TestQuotaContinuity changes a limit's count or burst between decisions, as a
// policy reload does, on a real redis-server and on the Go model: the state carries
// over. A monthly quota raised from 10,000 to 12,000 after 9,999 uses leaves 2,001;
// 2/min raised to 5/min after 2 uses leaves 3 (for a bucket, the level carries:
// a token_bucket emptied stays empty; a gcra whose burst grows from 2 to 5 has 3
// more); lowering keeps the count and denies at once when it is over the new limit.
func TestQuotaContinuity(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC).UnixMicro()
	doc := func(client, limit string) string {
		return "domain: d\nprefix: \"" + client + ":\"\nrules:\n  - {name: per-key, match: {api_key: \"*\"}, limits: [" + limit + "]}\n"
	}
	key := map[string]string{"api_key": "k1"}

	t.Run("monthly quota raised", func(t *testing.T) {
		stores := [2]decider{rs, memstore.New(0, nil)}
		before, after := doc("month", "{algorithm: fixed_window, rate: 10000/month}"), doc("month", "{algorithm: fixed_window, rate: 12000/month}")
		if ok, d := reloaded(t, stores, before, key, 9999, now); !ok || d.Remaining != 1 {
			t.Fatalf("9,999 of 10,000/month: allowed %v, remaining %d, want true, 1", ok, d.Remaining)
		}
		if f := policy.Fresh(mustPolicy(t, before), mustPolicy(t, after)); f != nil {
			t.Errorf("Fresh(10000/month, 12000/month) = %q, want none", f)
		}
		// On the 20th the customer upgrades: the month goes on from 9,999.
		if ok, d := reloaded(t, stores, after, key, 0, now+time.Hour.Microseconds()); !ok || d.Remaining != 2001 {
			t.Fatalf("after raising to 12,000/month: allowed %v, remaining %d, want true, 2001", ok, d.Remaining)
		}
		if ok, d := reloaded(t, stores, after, key, 2001, now+time.Hour.Microseconds()); !ok || d.Remaining != 0 {
			t.Fatalf("2,001 more: allowed %v, remaining %d, want true, 0", ok, d.Remaining)
		}
		if ok, _ := reloaded(t, stores, after, key, 1, now+time.Hour.Microseconds()); ok {
			t.Fatal("the 12,001st unit of the month is allowed, want denied")
		}
	})

	tests := []struct {
		algorithm    string
		from, to     string // the limit's rate and burst before and after
		used         int64  // units admitted before the change
		left         int64  // remaining after it
		allowedAfter bool   // whether one more unit is admitted after it
	}{
		{"fixed_window", "rate: 2/min", "rate: 5/min", 2, 3, true},
		{"sliding_log", "rate: 2/min", "rate: 5/min", 2, 3, true},
		{"sliding_window", "rate: 2/min", "rate: 5/min", 2, 3, true},
		{"bucket_ring", "rate: 2/min", "rate: 5/min", 2, 3, true},
		{"token_bucket", "rate: 2/min", "rate: 5/min", 2, 0, false}, // the bucket's level (0 tokens) carries
		{"gcra", "rate: 2/min, burst: 2", "rate: 2/min, burst: 5", 2, 3, true},
		{"leaky_bucket", "rate: 2/min, burst: 2", "rate: 2/min, burst: 5", 2, 3, true},
		{"fixed_window", "rate: 5/min", "rate: 2/min", 4, 0, false},
		{"sliding_log", "rate: 5/min", "rate: 2/min", 4, 0, false},
		{"sliding_window", "rate: 5/min", "rate: 2/min", 4, 0, false},
		{"bucket_ring", "rate: 5/min", "rate: 2/min", 4, 0, false},
		{"token_bucket", "rate: 5/min", "rate: 2/min", 1, 2, true}, // 4 tokens, clamped to the new burst of 2
		{"gcra", "rate: 2/min, burst: 5", "rate: 2/min, burst: 2", 4, 0, false},
		{"leaky_bucket", "rate: 2/min, burst: 5", "rate: 2/min, burst: 2", 4, 0, false},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%s %s to %s", tt.algorithm, tt.from, tt.to), func(t *testing.T) {
			stores := [2]decider{rs, memstore.New(0, nil)}
			client := fmt.Sprintf("c%d", i)
			before := doc(client, "{algorithm: "+tt.algorithm+", "+tt.from+"}")
			after := doc(client, "{algorithm: "+tt.algorithm+", "+tt.to+"}")
			if f := policy.Fresh(mustPolicy(t, before), mustPolicy(t, after)); f != nil {
				t.Errorf("Fresh() = %q, want none: the state carries over", f)
			}
			for u := range tt.used {
				if ok, _ := reloaded(t, stores, before, key, 1, now+u); !ok {
					t.Fatalf("use %d of %s denied", u+1, tt.from)
				}
			}
			at := now + tt.used
			if _, d := reloaded(t, stores, after, key, 0, at); d.Remaining != tt.left {
				t.Errorf("after %d uses of %s, %s leaves %d, want %d", tt.used, tt.from, tt.to, d.Remaining, tt.left)
			}
			if ok, d := reloaded(t, stores, after, key, 1, at); ok != tt.allowedAfter {
				t.Errorf("one more unit under %s: allowed %v (retry after %v), want %v", tt.to, ok, d.RetryAfter, tt.allowedAfter)
			}
		})
	}
}

func mustPolicy(t *testing.T, doc string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConformanceAcrossLimitChanges runs random sequences through the Go model and
// the Lua script, as TestConformance does, and changes the meter's count and burst
// (keeping what its key names: algorithm, period, bucket, and a gcra's or
// leaky_bucket's count) once or twice on the way, as a policy reload does: the two
// must decide alike on state left by another limit, over it or under it.
func TestConformanceAcrossLimitChanges(t *testing.T) {
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
			for seq := range sequences / 4 {
				r := rand.New(rand.NewPCG(uint64(seq), 4099+uint64(len(a))))
				m := randomMeter(r, a)
				ms := memstore.New(0, nil)
				keys := []string{algo.Key("cont:", fmt.Sprintf("%s-%d", a, seq), "r", "", "0")}
				now := base + r.Int64N(int64(time.Hour/time.Microsecond))
				for i := range 20 + r.IntN(30) {
					if i > 0 && r.IntN(8) == 0 {
						next := changed(r, m)
						if algo.MeterID(0, next) != algo.MeterID(0, m) {
							t.Fatalf("changed(%v) = %v, which has another MeterID", m, next)
						}
						m = next
					}
					if err := m.Validate(); err != nil {
						t.Fatalf("seq %d: meter %v: %v", seq, m, err)
					}
					now += step(r, m.Limits[0].Period)
					cost := int64(1)
					if r.IntN(4) == 0 {
						cost = r.Int64N(5)
					}
					c := algo.Check{Keys: keys, Meters: []algo.Meter{m}, Cost: cost, NowMicros: now}
					want, err := ms.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					got, err := rs.Decide(ctx, c)
					if err != nil {
						t.Fatalf("seq %d step %d: redis: %v", seq, i, err)
					}
					decisions++
					if got.Allowed != want.Allowed {
						t.Fatalf("seq %d step %d (%v, now %d, cost %d): allowed lua %v, model %v\nlua   %+v\nmodel %+v", seq, i, m, now, cost, got.Allowed, want.Allowed, got.Decisions, want.Decisions)
					}
					for j := range want.Decisions[0] {
						if !sameDecision(got.Decisions[0][j], want.Decisions[0][j]) {
							t.Fatalf("seq %d step %d (%v, now %d, cost %d): limit %d\nlua   %+v\nmodel %+v", seq, i, m, now, cost, j, got.Decisions[0][j], want.Decisions[0][j])
						}
					}
				}
			}
			t.Logf("%s: %d identical decisions across limit changes", a, decisions)
		})
	}
}

// changed returns m with new counts and bursts, as a reload that keeps its state
// would give it: gcra and leaky_bucket keep their count (their state counts in
// period/count), every other algorithm may take any count.
func changed(r *rand.Rand, m algo.Meter) algo.Meter {
	m.Limits = slices.Clone(m.Limits)
	for i := range m.Limits {
		l := &m.Limits[i]
		if l.Algorithm != algo.GCRA && l.Algorithm != algo.LeakyBucket {
			l.Count = 1 + r.Int64N(15)
			if l.Algorithm == algo.TokenBucket {
				for l.Period/time.Microsecond < time.Duration(l.Count) {
					l.Count = max(1, l.Count/2)
				}
			}
		}
		if l.Algorithm.HasBurst() {
			l.Burst = r.Int64N(21) // 0: the count
		}
	}
	return m
}

// TestCounterAcrossPlans moves a key from the free rule to the pro rule, whose
// monthly limits share a counter, on a real redis-server and on the Go model: the
// month's count goes with it (9,999 used of 10,000 on free leaves 90,001 of 100,000
// on pro), and back on free the key is over its limit at once.
func TestCounterAcrossPlans(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	stores := [2]decider{rs, memstore.New(0, nil)}
	doc := `domain: d
shard_by: api_key
rules:
  - {name: free, match: {api_key: "*", plan: free}, limits: [{algorithm: fixed_window, rate: 10000/month, counter: monthly}]}
  - {name: pro, match: {api_key: "*", plan: pro}, limits: [{algorithm: fixed_window, rate: 100000/month, counter: monthly}]}
`
	now := time.Date(2026, 11, 20, 12, 0, 0, 0, time.UTC).UnixMicro()
	free, pro := map[string]string{"api_key": "k1", "plan": "free"}, map[string]string{"api_key": "k1", "plan": "pro"}
	if ok, d := reloaded(t, stores, doc, free, 9999, now); !ok || d.Remaining != 1 {
		t.Fatalf("9,999 on free: allowed %v, remaining %d, want true, 1", ok, d.Remaining)
	}
	if ok, d := reloaded(t, stores, doc, pro, 1, now+1); !ok || d.Remaining != 90000 {
		t.Fatalf("one more on pro: allowed %v, remaining %d, want true, 90000", ok, d.Remaining)
	}
	if ok, d := reloaded(t, stores, doc, free, 1, now+2); ok || d.Remaining != 0 {
		t.Fatalf("back on free after 10,000: allowed %v, remaining %d, want false, 0", ok, d.Remaining)
	}
	other := map[string]string{"api_key": "k2", "plan": "free"}
	if ok, d := reloaded(t, stores, doc, other, 1, now+3); !ok || d.Remaining != 9999 {
		t.Fatalf("another key on free: allowed %v, remaining %d, want true, 9999", ok, d.Remaining)
	}
}
