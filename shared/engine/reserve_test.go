package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestReserveSettleExact: 64 goroutines on two engines (two instances) reserve a
// random estimate and settle a random actual cost, half of them on the other
// instance; the counter ends at exactly the sum of the actual costs (every refund
// and every extra charge exact), on standalone Redis and on a cluster.
func TestReserveSettleExact(t *testing.T) {
	for _, tg := range settleTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			p := tenantPolicy(t, "      - {algorithm: fixed_window, rate: 1000000000000/366d}\n")
			var engs [2]*engine.Engine
			for i := range engs {
				e, err := engine.New(engine.Config{Policy: p, Store: tg.store})
				if err != nil {
					t.Fatal(err)
				}
				engs[i] = e
			}
			tenant := map[string]string{"tenant": "exact-" + tg.name + strconv.FormatInt(time.Now().UnixNano(), 36)}
			ctx := context.Background()
			var actual, refunded, extra atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 3))
					for i := range 20 {
						id := strconv.Itoa(g) + "-" + strconv.Itoa(i)
						est, act := 1+r.Int64N(300), r.Int64N(300)
						rp, _ := engs[0].Plan(engine.Request{Domain: "ai", Attributes: tenant, Cost: est})
						if v, err := engs[0].Reserve(ctx, rp, id, time.Minute); err != nil || !v.Allowed {
							t.Errorf("Reserve(%d) = %v, %v", est, v.Allowed, err)
							return
						}
						sp, _ := engs[i%2].Plan(engine.Request{Domain: "ai", Attributes: tenant, Cost: act})
						if _, err := engs[i%2].SettleReserved(ctx, sp, id); err != nil {
							t.Errorf("SettleReserved(%s, %d) = %v", id, act, err)
							return
						}
						actual.Add(act)
						if act < est {
							refunded.Add(est - act)
						} else {
							extra.Add(act - est)
						}
					}
				}()
			}
			wg.Wait()
			keys, _, err := engs[0].Keys("ai", tenant)
			if err != nil {
				t.Fatal(err)
			}
			if got := windowCount(t, tg.client, keys[0]); got != actual.Load() {
				t.Fatalf("counter = %d, want %d, the sum of the actual costs", got, actual.Load())
			}
			t.Logf("%s: 1280 reservations, counter %d = sum of actual costs; %d units refunded, %d charged extra", tg.name, actual.Load(), refunded.Load(), extra.Load())
		})
	}
}

// TestReserveErrors: a settlement for an unknown, settled or expired reservation gets
// ErrUnknownReservation (an expired one's estimate stands), a reused id is refused and
// its estimate given back, a denied reservation keeps nothing, and limits without a
// refund are refused with the fix.
func TestReserveErrors(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: fixed_window, rate: 1000/min}\n"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	tenant := map[string]string{"tenant": "errors"}
	plan := func(cost int64) engine.Plan {
		p, err := eng.Plan(engine.Request{Domain: "ai", Attributes: tenant, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	remaining := func() int64 {
		v, err := eng.Peek(ctx, plan(0))
		if err != nil {
			t.Fatal(err)
		}
		return v.Decision.Remaining
	}
	start := remaining()
	if _, err := eng.SettleReserved(ctx, plan(5), "never"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("SettleReserved(unknown) = %v, want ErrUnknownReservation", err)
	}
	if _, err := eng.Reserve(ctx, plan(100), "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Reserve(ctx, plan(100), "a", time.Minute); !errors.Is(err, engine.ErrBadRequest) {
		t.Fatalf("Reserve(reused id) = %v, want ErrBadRequest", err)
	}
	if got := remaining(); got != start-100 {
		t.Fatalf("remaining after a reused id = %d, want %d (its estimate given back)", got, start-100)
	}
	if _, err := eng.SettleReserved(ctx, plan(40), "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.SettleReserved(ctx, plan(40), "a"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("second SettleReserved = %v, want ErrUnknownReservation", err)
	}
	if got := remaining(); got != start-40 {
		t.Fatalf("remaining after settling 40 of 100 = %d, want %d", got, start-40)
	}
	// Expired: the estimate stands.
	if _, err := eng.Reserve(ctx, plan(70), "short", 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	time.Sleep(120 * time.Millisecond)
	if _, err := eng.SettleReserved(ctx, plan(10), "short"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("SettleReserved(expired) = %v, want ErrUnknownReservation", err)
	}
	if got := remaining(); got != start-110 {
		t.Fatalf("remaining after an expired reservation of 70 = %d, want %d (the estimate stands)", got, start-110)
	}
	// Denied: nothing kept.
	if v, err := eng.Reserve(ctx, plan(5000), "big", time.Minute); err != nil || v.Allowed {
		t.Fatalf("Reserve(5000 of 1000) = %v, %v, want a denial", v.Allowed, err)
	}
	if _, err := eng.SettleReserved(ctx, plan(1), "big"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("SettleReserved(denied) = %v, want ErrUnknownReservation", err)
	}
	for _, tc := range []struct {
		id  string
		ttl time.Duration
	}{{"", 0}, {string(make([]byte, 200)), 0}, {"x", 2 * time.Hour}} {
		if _, err := eng.Reserve(ctx, plan(1), tc.id, tc.ttl); !errors.Is(err, engine.ErrBadRequest) {
			t.Fatalf("Reserve(id of %d bytes, ttl %v) = %v, want ErrBadRequest", len(tc.id), tc.ttl, err)
		}
	}
	ring, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: bucket_ring, rate: 10/s}\n"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	rp, _ := ring.Plan(engine.Request{Domain: "ai", Attributes: tenant, Cost: 1})
	if _, err := ring.Reserve(ctx, rp, "ring", 0); !errors.Is(err, engine.ErrBadRequest) {
		t.Fatalf("Reserve on bucket_ring = %v, want ErrBadRequest naming the fix", err)
	}
}

// TestSettleStoreDown: a settlement the store cannot take is an error wrapping
// ErrSettleFailed, counted by the SettleFailed hook with its units, never admitted
// by a failure mode; Decide answers it unavailable.
func TestSettleStoreDown(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var failed, settled atomic.Int64
	p := tenantPolicy(t, "      - {algorithm: token_bucket, rate: 1000/min}\n")
	p.Failure.Mode = "open"
	eng, err := engine.New(engine.Config{Policy: p, Store: st, Hooks: engine.Hooks{
		SettleFailed: func(_ string, u int64, _ error) { failed.Add(u) },
		Settled:      func(_ string, u int64) { settled.Add(u) },
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "down"}, Cost: 300, Settle: true}
	if _, err := eng.Check(ctx, req); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	_, err = eng.Check(ctx, req)
	if !errors.Is(err, engine.ErrSettleFailed) {
		t.Fatalf("settle with Redis down = %v, want ErrSettleFailed", err)
	}
	p2, _ := eng.Plan(req)
	if v := eng.Decide(ctx, p2); v.Allowed || v.Reason != engine.ReasonUnavailable {
		t.Fatalf("Decide(settle, Redis down) = allowed %v reason %q, want unavailable", v.Allowed, v.Reason)
	}
	if settled.Load() != 300 || failed.Load() != 600 {
		t.Fatalf("hooks: settled %d failed %d units, want 300 and 600", settled.Load(), failed.Load())
	}
}

// TestReserveInProcess: without a store, reservations are kept in process and the
// same rules hold: the difference settled or given back, a reservation taken once,
// an expired one's estimate standing.
func TestReserveInProcess(t *testing.T) {
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	eng, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: fixed_window, rate: 1000/h}\n"), Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	plan := func(cost int64) engine.Plan {
		p, err := eng.Plan(engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "local"}, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	if _, err := eng.Reserve(ctx, plan(300), "a", time.Minute); err != nil {
		t.Fatal(err)
	}
	v, err := eng.SettleReserved(ctx, plan(100), "a")
	if err != nil || v.Decision.Remaining != 900 {
		t.Fatalf("settle 100 of a reserved 300 = remaining %d, %v; want 900", v.Decision.Remaining, err)
	}
	if _, err := eng.Reserve(ctx, plan(800), "b", time.Minute); err != nil {
		t.Fatal(err)
	}
	v, err = eng.SettleReserved(ctx, plan(1000), "b")
	if err != nil || v.Decision.Remaining != 0 || !v.Allowed {
		t.Fatalf("settle 1000 of a reserved 800 = allowed %v remaining %d, %v; want a debt (remaining 0)", v.Allowed, v.Decision.Remaining, err)
	}
	if _, err := eng.SettleReserved(ctx, plan(1000), "b"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("second settlement = %v, want ErrUnknownReservation", err)
	}
	if v := eng.Decide(ctx, plan(1)); v.Allowed {
		t.Fatal("a check after a debt of 100 was admitted")
	}
	mu.Lock()
	now = now.Add(time.Hour) // the next window
	mu.Unlock()
	if _, err := eng.Reserve(ctx, plan(50), "c", time.Second); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	now = now.Add(2 * time.Second)
	mu.Unlock()
	if _, err := eng.SettleReserved(ctx, plan(10), "c"); !errors.Is(err, engine.ErrUnknownReservation) {
		t.Fatalf("settlement after the reservation's ttl = %v, want ErrUnknownReservation", err)
	}
	if v, _ := eng.Peek(ctx, plan(0)); v.Decision.Remaining != 950 {
		t.Fatalf("remaining after an expired reservation of 50 = %d, want 950 (the estimate stands)", v.Decision.Remaining)
	}
}

// failingRefunder fails every refund, as a Redis node that is down would.
type failingRefunder struct{}

func (failingRefunder) Refund(context.Context, algo.Check, int64) error {
	return errors.New("node down")
}

// TestSettleReservedKeptOnFailure: a settlement that takes its reservation and then
// fails to charge or give back the difference puts the reservation back, so that the
// settlement sent again lands.
func TestSettleReservedKeptOnFailure(t *testing.T) {
	p := tenantPolicy(t, "      - {algorithm: fixed_window, rate: 1000/h}\n")
	broken, err := engine.New(engine.Config{Policy: p, Refunder: failingRefunder{}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	plan := func(cost int64) engine.Plan {
		pl, err := broken.Plan(engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "t"}, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return pl
	}
	if _, err := broken.Reserve(ctx, plan(300), "r", time.Minute); err != nil {
		t.Fatal(err)
	}
	_, err = broken.SettleReserved(ctx, plan(100), "r")
	if !errors.Is(err, engine.ErrSettleFailed) || !strings.Contains(err.Error(), "kept") {
		t.Fatalf("SettleReserved with the refund failing = %v, want ErrSettleFailed with the reservation kept", err)
	}
	// The settlement sent again finds the reservation (and fails the same way here:
	// the refunder is still down); an extra charge needs no refund and lands.
	if _, err := broken.SettleReserved(ctx, plan(400), "r"); err != nil {
		t.Fatalf("SettleReserved(400) sent again = %v, want it to land", err)
	}
	if v, _ := broken.Peek(ctx, plan(0)); v.Decision.Remaining != 600 {
		t.Fatalf("remaining = %d, want 600", v.Decision.Remaining)
	}
}
