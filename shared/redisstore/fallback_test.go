package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// TestScriptsWithoutFunctions decides on a server without Redis Functions (miniredis,
// what `make run` embeds): the store finds that out from the first call, without
// Preload, and runs the same Lua by EVALSHA. Random sequences of every algorithm must
// decide as the Go model does, through Store.Decide and through a batch (the many
// entry), and again after SCRIPT FLUSH.
func TestScriptsWithoutFunctions(t *testing.T) {
	t.Parallel()
	mr := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	store, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	b := batched(t, store, batchOn)
	ctx := context.Background()
	now := int64(1_750_000_000_000_000)
	for _, a := range algo.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			r := rand.New(rand.NewPCG(7, uint64(len(a))))
			for seq := range 20 {
				m := randomMeter(r, a)
				model := memstore.New(0, nil)
				keys := []string{algo.Key("fallback:", fmt.Sprintf("%s-%d", a, seq), "r", "", "0")}
				at := now
				for i := range 12 {
					if i == 6 && seq == 0 {
						if err := client.ScriptFlush(ctx).Err(); err != nil {
							t.Fatal(err)
						}
					}
					at += step(r, m.Limits[0].Period)
					c := algo.Check{Keys: keys, Meters: []algo.Meter{m}, Cost: r.Int64N(3), NowMicros: at}
					want, err := model.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					var d decider = store
					if i%2 == 1 {
						d = b
					}
					got, err := d.Decide(ctx, c)
					if err != nil {
						t.Fatalf("seq %d step %d: Check(%s) = %v", seq, i, m.Limits[0], err)
					}
					if got.Allowed != want.Allowed || !sameDecision(got.Decisions[0][0], want.Decisions[0][0]) {
						t.Fatalf("seq %d step %d: Check(%s, cost %d) = %v %+v, want %v %+v", seq, i, m.Limits[0], c.Cost, got.Allowed, got.Decisions[0][0], want.Allowed, want.Decisions[0][0])
					}
				}
			}
		})
	}
}
