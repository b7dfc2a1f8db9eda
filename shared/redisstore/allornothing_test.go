package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// passingMeter returns a meter of algorithm a that admits the requests of the
// all-or-nothing tests: 10 per minute, recording a value where the algorithm keeps one.
func passingMeter(a algo.Algorithm) algo.Meter {
	m := meterOf(a, 10, time.Minute)
	if a.CanRecord() {
		m.Record = "user-1"
	}
	return m
}

// denyingMeter is B, a fixed_window of 1 per hour that a first request exhausts.
var denyingMeter = algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 1, Period: time.Hour}}}

// allOrNothingCase is one way of meeting A and an exhausted B in one request.
type allOrNothingCase struct {
	name    string
	charged bool // A already holds state from an earlier admitted request
	bFirst  bool // B comes before A in the request
}

var allOrNothingCases = []allOrNothingCase{
	{name: "fresh A", charged: false},
	{name: "charged A", charged: true},
	{name: "charged A after B", charged: true, bFirst: true},
}

// checkAllOrNothing charges B to exhaustion (and A once, if the case says so),
// then sends a request on A and B, which B denies, and requires A's keys to be the
// same before and after, byte for byte (DUMP) and to the millisecond (PEXPIRETIME).
// master returns the node that holds a key.
func checkAllOrNothing(t *testing.T, store *redisstore.Store, master func(key string) *redis.Client, tagA, tagB string, tc allOrNothingCase, a algo.Algorithm, now int64) {
	t.Helper()
	ctx := context.Background()
	ma := passingMeter(a)
	keyA := algo.Key("aon:", tagA, string(a), "", "0")
	keyB := algo.Key("aon:", tagB, "global", algo.Escape(tagA), "0")
	if o, err := store.Decide(ctx, algo.Check{Keys: []string{keyB}, Meters: []algo.Meter{denyingMeter}, Cost: 1, NowMicros: now}); err != nil || !o.Allowed {
		t.Fatalf("exhausting B: Check(%s) = %v, %v, want allowed", keyB, o.Allowed, err)
	}
	if tc.charged {
		if o, err := store.Decide(ctx, algo.Check{Keys: []string{keyA}, Meters: []algo.Meter{ma}, Cost: 1, NowMicros: now}); err != nil || !o.Allowed {
			t.Fatalf("charging A: Check(%s) = %v, %v, want allowed", keyA, o.Allowed, err)
		}
	}
	before := snapshot(t, master(keyA), keyA)
	if tc.charged && len(before) == 0 {
		t.Fatalf("A (%s) holds no keys after an admitted request", keyA)
	}
	c := algo.Check{Keys: []string{keyA, keyB}, Meters: []algo.Meter{ma, denyingMeter}, Cost: 2, NowMicros: now + 1000}
	if tc.bFirst {
		c = algo.Check{Keys: []string{keyB, keyA}, Meters: []algo.Meter{denyingMeter, ma}, Cost: 2, NowMicros: now + 1000}
	}
	o, err := safeDecide(ctx, store, c)
	if err != nil {
		t.Fatal(err)
	}
	if o.Allowed {
		t.Fatalf("Check(A %s, B exhausted).Allowed = true, want false", ma.Limits[0])
	}
	after := snapshot(t, master(keyA), keyA)
	if d := diffSnapshots(before, after); d != "" {
		t.Errorf("Check(A %s, B exhausted) denied but changed A:%s", ma.Limits[0], d)
	}
}

// TestAllOrNothing sends a request that meter A admits and meter B (an exhausted
// fixed_window) denies, in one script on one server, and requires A's Redis state to
// be unchanged byte for byte, for every algorithm as A.
func TestAllOrNothing(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	store := loadedStore(t, client)
	now := serverTime(t, client)
	for _, a := range algo.Algorithms {
		for _, tc := range allOrNothingCases {
			t.Run(string(a)+"/"+tc.name, func(t *testing.T) {
				tag := fmt.Sprintf("client-%s-%t-%t", a, tc.charged, tc.bFirst)
				master := func(string) *redis.Client { return client }
				checkAllOrNothing(t, store, master, tag, tag, tc, a, now)
			})
		}
	}
}

// TestAllOrNothingCluster is TestAllOrNothing on a three-master cluster with A and B
// in different slots on different masters: the store charges A's slot first (with
// undo data), B's slot denies, and the refund must restore A byte for byte. With B
// first, A's slot is only peeked at.
func TestAllOrNothingCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	cc := cl.Client(t)
	store := loadedStore(t, cc)
	ctx := context.Background()
	master := func(key string) *redis.Client {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	now := serverTime(t, master("x"))
	for _, a := range algo.Algorithms {
		for _, tc := range allOrNothingCases {
			t.Run(string(a)+"/"+tc.name, func(t *testing.T) {
				tagA := fmt.Sprintf("client-%s-%t-%t", a, tc.charged, tc.bFirst)
				keyA := algo.Key("aon:", tagA, string(a), "", "0")
				// Find a tag for B on another master than A's.
				tagB := ""
				for i := 0; tagB == ""; i++ {
					tag := fmt.Sprintf("global-%d", i)
					if master(algo.Key("aon:", tag, "global", "", "0")).Options().Addr != master(keyA).Options().Addr {
						tagB = tag
					}
				}
				if algo.Slot(keyA) == algo.Slot(algo.Key("aon:", tagB, "global", "", "0")) {
					t.Fatalf("A and B share slot %d", algo.Slot(keyA))
				}
				checkAllOrNothing(t, store, master, tagA, tagB, tc, a, now)
			})
		}
	}
}

// TestRefundLogicalInverse exercises the refund entry's second path, the one taken when
// another request wrote A between a charge and its refund: A is charged with undo
// data (cost 2 at t1), charged again normally (cost 3 at t2), and the first charge is
// refunded. A must then decide exactly as a fresh Go model that saw only the second
// charge, over a series of later requests. "same instant" has t2 = t1; "later" has
// t2 = t1 + 1.5 s, in the same window of every windowed algorithm.
func TestRefundLogicalInverse(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	ctx := context.Background()
	lua := loadLua(t, client)
	decide, refund := lua.Function(algo.EntryDecide), lua.Function(algo.EntryRefund)
	const period = 10 * time.Second
	p := period.Microseconds()
	// t1 is 1 s into a 10 s window (and into a 1 s bucket of the ring).
	t1 := serverTime(t, client)/p*p + p + 1_000_000
	cases := []struct {
		name string
		gap  int64 // t2 - t1, µs
	}{
		{"same instant", 0},
		{"later", 1_500_000},
	}
	for _, a := range algo.Algorithms {
		for _, tc := range cases {
			t.Run(string(a)+"/"+tc.name, func(t *testing.T) {
				m := meterOf(a, 10, period)
				if a.CanRecord() {
					m.Record = "user-1"
				}
				meters := []algo.Meter{m}
				key := algo.Key("refund:", fmt.Sprintf("%s-%d", a, tc.gap), "r", "", "0")
				keys := []string{key}
				const c1, c2 = 2, 3
				t2 := t1 + tc.gap

				v, err := client.FCall(ctx, decide, keys, algo.DecideArgs(meters, c1, t1, true)...).Result()
				if err != nil {
					t.Fatal(err)
				}
				first, err := algo.ParseDecideReply(v, meters)
				if err != nil {
					t.Fatal(err)
				}
				if !first.Allowed || len(first.Undo) != 1 {
					t.Fatalf("first charge: allowed %v, %d undo records, want allowed with 1", first.Allowed, len(first.Undo))
				}
				v, err = client.FCall(ctx, decide, keys, algo.DecideArgs(meters, c2, t2, false)...).Result()
				if err != nil {
					t.Fatal(err)
				}
				if second, err := algo.ParseDecideReply(v, meters); err != nil || !second.Allowed {
					t.Fatalf("second charge: allowed %v, %v, want allowed", second.Allowed, err)
				}
				rkeys, rargs := algo.RefundCall(meters, keys, first.Undo, first.NowMicros, t2, c1)
				exact, err := client.FCall(ctx, refund, rkeys, rargs...).Int64()
				if err != nil {
					t.Fatal(err)
				}
				if exact != 0 {
					t.Fatalf("refund restored %d meters byte for byte, want 0 (the second charge changed A)", exact)
				}

				model := memstore.New(0, nil)
				if o, err := model.Decide(ctx, algo.Check{Keys: keys, Meters: meters, Cost: c2, NowMicros: t2}); err != nil || !o.Allowed {
					t.Fatalf("model: second charge: %v, %v", o.Allowed, err)
				}
				store := loadedStore(t, client)
				// Probes: a peek, then requests of cost 1 at t2 and every 250 ms after,
				// until well past the point where every limit denies.
				for i := range 16 {
					now, cost := t2+int64(max(0, i-2))*250_000, int64(1)
					if i == 0 {
						cost = 0
					}
					c := algo.Check{Keys: keys, Meters: meters, Cost: cost, NowMicros: now}
					want, err := model.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					got, err := store.Decide(ctx, c)
					if err != nil {
						t.Fatal(err)
					}
					if got.Allowed != want.Allowed || !sameDecision(got.Decisions[0][0], want.Decisions[0][0]) {
						t.Fatalf("probe %d after refund: Check(%s, cost %d, t2%+dµs) = %+v, want %+v (model of the second charge alone)",
							i, m.Limits[0], cost, now-t2, got.Decisions[0][0], want.Decisions[0][0])
					}
				}
			})
		}
	}
}

// safeDecide is store.Decide with a panic turned into an error, so that a bad
// request fails its own test rather than ending the package's test binary.
func safeDecide(ctx context.Context, store *redisstore.Store, c algo.Check) (o algo.Outcome, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("Decide(%v) panicked: %v", c.Keys, r)
		}
	}()
	return store.Decide(ctx, c)
}

// TestDecideUndoMeterIndex checks the meter index of the decide entry's undo
// records, which RefundCall uses to index the call's meters: with undo on, each
// charged meter's record must carry its index in the call, 0-based as Undo.Meter
// documents ("index of the meter in the call").
func TestDecideUndoMeterIndex(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	ctx := context.Background()
	decide := loadLua(t, client).Function(algo.EntryDecide)
	now := serverTime(t, client)
	tests := []struct {
		name   string
		meters []algo.Meter
	}{
		{"one meter", []algo.Meter{meterOf(algo.GCRA, 10, time.Minute)}},
		{"three meters", []algo.Meter{meterOf(algo.FixedWindow, 10, time.Minute), meterOf(algo.TokenBucket, 10, time.Minute), meterOf(algo.SlidingLog, 10, time.Minute)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var keys []string
			for i := range tt.meters {
				keys = append(keys, algo.Key("undo:", "client-1", tt.name, "", strconv.Itoa(i)))
			}
			v, err := client.FCall(ctx, decide, keys, algo.DecideArgs(tt.meters, 1, now, true)...).Result()
			if err != nil {
				t.Fatal(err)
			}
			rep, err := algo.ParseDecideReply(v, tt.meters)
			if err != nil {
				t.Fatal(err)
			}
			if len(rep.Undo) != len(tt.meters) {
				t.Fatalf("Check(%d meters, undo) gave %d undo records, want %d", len(tt.meters), len(rep.Undo), len(tt.meters))
			}
			for i, u := range rep.Undo {
				if u.Meter != i {
					t.Errorf("Check(%d meters, undo).Undo[%d].Meter = %d, want %d", len(tt.meters), i, u.Meter, i)
				}
			}
		})
	}
}
