package engine_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/engine"
)

// TestTakeGiveBack takes units of a fixed_window limit as a grant would, on the
// in-process store, standalone Redis and a cluster: what the limit holds, then what
// is left of it, then nothing; a give back returns units to the window they were
// taken from; and the limit's count in the store is exactly what was taken less what
// came back.
func TestTakeGiveBack(t *testing.T) {
	p := tenantPolicy(t, "      - {algorithm: fixed_window, rate: 100/1h}\n")
	type target struct {
		name  string
		store engine.Store
	}
	targets := []target{{"in-process", nil}}
	for _, tg := range settleTargets(t) {
		targets = append(targets, target{tg.name, tg.store})
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			eng, err := engine.New(engine.Config{Policy: p, Store: tg.store})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			plan, err := eng.Plan(engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "take-" + strconv.FormatInt(time.Now().UnixNano(), 36)}})
			if err != nil {
				t.Fatal(err)
			}
			remaining := func() int64 {
				v, err := eng.Peek(ctx, plan)
				if err != nil {
					t.Fatal(err)
				}
				return v.Limits[0].Remaining
			}
			first, err := eng.Take(ctx, plan, 60)
			if err != nil || first.Units != 60 {
				t.Fatalf("Take(60) = %d, %v; want 60", first.Units, err)
			}
			if got := remaining(); got != 40 {
				t.Fatalf("remaining after Take(60) = %d, want 40", got)
			}
			if tk, err := eng.Take(ctx, plan, 70); err != nil || tk.Units != 40 {
				t.Fatalf("Take(70) with 40 left = %d, %v; want 40 (what is left)", tk.Units, err)
			}
			if tk, err := eng.Take(ctx, plan, 1); err != nil || tk.Units != 0 {
				t.Fatalf("Take(1) of a spent limit = %d, %v; want 0", tk.Units, err)
			}
			if err := eng.GiveBack(ctx, plan, 25, first.Verdict.NowMicros); err != nil {
				t.Fatal(err)
			}
			if got := remaining(); got != 25 {
				t.Fatalf("remaining after GiveBack(25) = %d, want 25", got)
			}
			if tk, err := eng.Take(ctx, plan, 0); err != nil || tk.Units != 0 {
				t.Fatalf("Take(0) = %d, %v; want 0", tk.Units, err)
			}
		})
	}
}
