package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestSettleConformance runs random sequences of checks and settlements (charges
// that are never refused, often past the limit) through the Go model (memstore) and
// the Lua (real Redis), and requires identical decisions, as TestConformance does:
// the debt a settlement leaves is paid back the same way by both.
func TestSettleConformance(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	base := time.Now().UnixMicro()
	for _, a := range algo.Algorithms {
		if !a.CanSettle() {
			continue
		}
		t.Run(string(a), func(t *testing.T) {
			t.Parallel()
			decisions, settles, debts := 0, 0, 0
			for seq := range sequences / 2 {
				seed := uint64(seq)*104729 + uint64(len(a))
				r := rand.New(rand.NewPCG(seed, uint64(seq)+1))
				m := randomMeter(r, a)
				ms := memstore.New(0, nil)
				keys := []string{algo.Key("settle:", fmt.Sprintf("%s-%d", a, seq), "r", "", "0")}
				meters := []algo.Meter{m}
				if seq%2 == 1 {
					keys = append(keys, algo.Key("settle:", fmt.Sprintf("%s-%d", a, seq), "r", "", "1"))
					meters = append(meters, randomMeter(r, a))
				}
				now := base + r.Int64N(int64(time.Hour/time.Microsecond))
				for i := range 10 + r.IntN(30) {
					now += step(r, m.Limits[0].Period)
					cost := int64(1)
					settle := r.IntN(3) == 0
					if settle || r.IntN(4) == 0 {
						cost = r.Int64N(3 * (m.Limits[0].Count + 1))
					}
					c := algo.Check{Keys: keys, Meters: meters, Cost: cost, NowMicros: now, Settle: settle}
					want, err := ms.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					got, err := rs.Decide(ctx, c)
					if err != nil {
						t.Fatalf("seed %d step %d: redis: %v", seed, i, err)
					}
					decisions++
					if settle {
						settles++
						if !got.Allowed {
							t.Fatalf("seed %d step %d: settle of %d answered not allowed", seed, i, cost)
						}
						if got.Decisions[0][0].Remaining == 0 {
							debts++
						}
					}
					if got.Allowed != want.Allowed {
						t.Fatalf("seed %d step %d (%v, now %d, cost %d, settle %v): allowed lua %v, model %v\nlua   %+v\nmodel %+v", seed, i, meters, now, cost, settle, got.Allowed, want.Allowed, got.Decisions, want.Decisions)
					}
					for mi := range want.Decisions {
						for j := range want.Decisions[mi] {
							if !sameDecision(got.Decisions[mi][j], want.Decisions[mi][j]) {
								t.Fatalf("seed %d step %d (%v, now %d, cost %d, settle %v): meter %d limit %d\nlua   %+v\nmodel %+v", seed, i, meters, now, cost, settle, mi, j, got.Decisions[mi][j], want.Decisions[mi][j])
							}
						}
					}
				}
			}
			if settles == 0 || debts == 0 {
				t.Fatalf("%s: %d settlements, %d left a debt: the sequences do not reach a debt", a, settles, debts)
			}
			t.Logf("%s: %d identical decisions, %d settlements, %d at remaining 0", a, decisions, settles, debts)
		})
	}
}

// TestSettleRefusesSlidingLog: a settlement on a sliding_log meter fails on both
// stores, names the fix, and charges none of the request's meters.
func TestSettleRefusesSlidingLog(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	fw := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 10, Period: time.Minute}}}
	sl := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 10, Period: time.Minute}}}
	c := algo.Check{Keys: []string{"{sl}:a", "{sl}:b"}, Meters: []algo.Meter{fw, sl}, Cost: 5, Settle: true}
	for name, st := range map[string]interface {
		Decide(context.Context, algo.Check) (algo.Outcome, error)
	}{"redis": rs, "memory": memstore.New(0, nil)} {
		if _, err := st.Decide(ctx, c); !errors.Is(err, algo.ErrCannotSettle) {
			t.Fatalf("%s: Decide(settle on sliding_log) = %v, want algo.ErrCannotSettle", name, err)
		}
		out, err := st.Decide(ctx, algo.Check{Keys: c.Keys[:1], Meters: c.Meters[:1], Cost: 0})
		if err != nil {
			t.Fatal(err)
		}
		if got := out.Decisions[0][0].Remaining; got != 10 {
			t.Fatalf("%s: fixed_window remaining after a refused settlement = %d, want 10", name, got)
		}
	}
	// The Lua refuses on its own too, before charging anything.
	lua := algo.Lua()
	err = srv.Client(t).Do(ctx, "eval", lua.Script(algo.EntrySettle), 2, "{sl}:a", "{sl}:b", "", 5, "0", 2, "fixed_window 0 10 60000000 10 0", "", "sliding_log 0 10 60000000 10 0", "").Err()
	if err == nil || !strings.Contains(err.Error(), "sliding_window") {
		t.Fatalf("settle script on sliding_log = %v, want an error naming the fix", err)
	}
}
