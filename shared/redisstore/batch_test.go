package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// openStore returns a store on srv with the scripts loaded, closed when t ends.
func openStore(t testing.TB, url string, cluster bool) *redisstore.Store {
	t.Helper()
	s, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("Open(%q) = %v", url, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Preload(ctx); err != nil {
		t.Fatalf("Preload() = %v", err)
	}
	return s
}

// batched returns a store with o on the client of s; closing s closes it.
func batched(t testing.TB, s *redisstore.Store, o redisstore.Options) *redisstore.Store {
	t.Helper()
	b, err := redisstore.NewWithOptions(s.Client(), o)
	if err != nil {
		t.Fatalf("NewWithOptions(%+v) = %v", o, err)
	}
	return b
}

// batchOn is batching with the defaults.
var batchOn = redisstore.Options{BatchWait: redisstore.DefaultBatchWait}

// decider is what a store, batching or not, and the Go model have in common.
type decider interface {
	Decide(ctx context.Context, c algo.Check) (algo.Outcome, error)
}

// hammer runs workers goroutines that each decide c perRun times and returns how many
// were admitted.
func hammer(t *testing.T, d decider, workers, perRun int, c algo.Check) int64 {
	t.Helper()
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for range perRun {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				out, err := d.Decide(ctx, c)
				cancel()
				if err != nil {
					errs <- err
					return
				}
				if out.Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Decide() = %v", err)
	}
	return admitted.Load()
}

// dayLimit is a limit of n per day: nothing refills during a test.
func dayLimit(a algo.Algorithm, n int64) algo.Limit {
	return algo.Limit{Algorithm: a, Count: n, Period: 24 * time.Hour}
}

func TestBatcherAdmitsExactlyTheLimit(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	// 64 goroutines × 200 decisions on a gcra limit of 500, batched or not.
	gcra := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 500)}}
	for _, mode := range []struct {
		name string
		d    decider
	}{
		{"store", s},
		{"batcher", batched(t, s, batchOn)},
	} {
		c := algo.Check{Keys: []string{"test:{exact64-" + mode.name + "}"}, Meters: []algo.Meter{gcra}, Cost: 1}
		if got := hammer(t, mode.d, 64, 200, c); got != 500 {
			t.Errorf("%s: 64×200 decisions on %s admitted %d, want 500", mode.name, gcra.Limits[0], got)
		}
	}
	// Every algorithm, every batch shape, fewer decisions (still past the limit) so
	// that the suite stays quick under -race.
	for _, a := range algo.Algorithms {
		t.Run(string(a), func(t *testing.T) {
			m := algo.Meter{Limits: []algo.Limit{dayLimit(a, 100)}}
			if a == algo.BucketRing {
				m.Limits[0].Period = time.Hour
			}
			for _, mode := range []struct {
				name string
				d    decider
			}{
				{"batcher", batched(t, s, batchOn)},
				{"batcher-small", batched(t, s, redisstore.Options{BatchWait: time.Microsecond, MaxBatch: 4})},
				{"unbatched", batched(t, s, redisstore.Options{})},
			} {
				key := fmt.Sprintf("test:{exact-%s-%s}", a, mode.name)
				c := algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1}
				if got := hammer(t, mode.d, 16, 10, c); got != 100 {
					t.Errorf("%s: 16×10 decisions on %s admitted %d, want 100", mode.name, m.Limits[0], got)
				}
			}
		})
	}
}

func TestBatcherAllOrNothing(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, batchOn)
	tight := algo.Meter{Limits: []algo.Limit{dayLimit(algo.FixedWindow, 300)}}
	loose := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 500)}}
	c := algo.Check{Keys: []string{"test:{aon}tight", "test:{aon}loose"}, Meters: []algo.Meter{tight, loose}, Cost: 1}
	if got := hammer(t, b, 32, 50, c); got != 300 {
		t.Fatalf("32×50 decisions on %v admitted %d, want 300", c.Meters, got)
	}
	// Peek (cost 0): the loose limit was charged only for the admitted requests.
	out, err := b.Decide(context.Background(), algo.Check{Keys: c.Keys[1:], Meters: c.Meters[1:], Cost: 0})
	if err != nil {
		t.Fatalf("Decide(peek) = %v", err)
	}
	if got := out.Decisions[0][0].Remaining; got != 200 {
		t.Errorf("loose limit remaining = %d, want 200 (charged only with the tight one)", got)
	}
}

func TestBatcherErrorsStayWithTheirRequest(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, redisstore.Options{BatchWait: time.Millisecond})
	ctx := context.Background()
	// A key of the wrong type makes the script fail for that request only.
	if err := s.Client().RPush(ctx, "test:{bad}list", "x").Err(); err != nil {
		t.Fatalf("RPUSH = %v", err)
	}
	good := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 1000000)}}
	var wg sync.WaitGroup
	var goodErrs, badOK atomic.Int64
	for i := range 64 {
		wg.Go(func() {
			for range 50 {
				if i%4 == 0 {
					_, err := b.Decide(ctx, algo.Check{Keys: []string{"test:{bad}list"}, Meters: []algo.Meter{good}, Cost: 1})
					if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
						badOK.Add(1)
						t.Errorf("Decide(list key) = %v, want a WRONGTYPE error", err)
					}
					continue
				}
				out, err := b.Decide(ctx, algo.Check{Keys: []string{fmt.Sprintf("test:{good}%d", i)}, Meters: []algo.Meter{good}, Cost: 1})
				if err != nil || !out.Allowed {
					goodErrs.Add(1)
					t.Errorf("Decide(good key) = %v, %v, want allowed", out.Allowed, err)
				}
			}
		})
	}
	wg.Wait()
	if goodErrs.Load()+badOK.Load() > 0 {
		t.Fatalf("%d good requests failed, %d bad ones succeeded", goodErrs.Load(), badOK.Load())
	}
}

// TestReloadKeepsTheScriptError checks that when the script cache was flushed and the
// EVAL that reloads it fails, the caller gets that failure (here WRONGTYPE: the key
// holds a list), from the store and from the batcher alike.
func TestReloadKeepsTheScriptError(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	m := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 100)}}
	for _, mode := range []struct {
		name string
		d    decider
	}{{"store", s}, {"batcher", batched(t, s, batchOn)}} {
		t.Run(mode.name, func(t *testing.T) {
			key := "test:{wrongtype}" + mode.name
			srv.Do(t, "RPUSH", key, "x")
			srv.Do(t, "SCRIPT", "FLUSH")
			_, err := mode.d.Decide(context.Background(), algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1})
			if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
				t.Errorf("Decide on a list key after SCRIPT FLUSH = %v, want the script's WRONGTYPE error", err)
			}
		})
	}
}

func TestBatcherReloadsFlushedScript(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, batchOn)
	srv.Do(t, "SCRIPT", "FLUSH")
	m := algo.Meter{Limits: []algo.Limit{dayLimit(algo.FixedWindow, 100)}}
	if got := hammer(t, b, 16, 20, algo.Check{Keys: []string{"test:{noscript}"}, Meters: []algo.Meter{m}, Cost: 1}); got != 100 {
		t.Errorf("after SCRIPT FLUSH, 16×20 decisions admitted %d, want 100", got)
	}
	srv.Do(t, "SCRIPT", "FLUSH")
	out, err := b.Decide(context.Background(), algo.Check{Keys: []string{"test:{noscript}lone"}, Meters: []algo.Meter{m}, Cost: 1})
	if err != nil || !out.Allowed {
		t.Errorf("lone Decide after SCRIPT FLUSH = %v, %v, want allowed", out.Allowed, err)
	}
}

func TestBatcherRespectsDeadline(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, batchOn)
	m := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 1000)}}
	// Redis stops answering for a while: every request must give up at its deadline.
	srv.Do(t, "CLIENT", "PAUSE", "1500", "ALL")
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, err := b.Decide(ctx, algo.Check{Keys: []string{fmt.Sprintf("test:{deadline}%d", i)}, Meters: []algo.Meter{m}, Cost: 1})
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("Decide() with Redis paused = %v, want a deadline error", err)
			}
		})
	}
	wg.Wait()
	srv.Do(t, "CLIENT", "UNPAUSE")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if out, err := b.Decide(ctx, algo.Check{Keys: []string{"test:{deadline}after"}, Meters: []algo.Meter{m}, Cost: 1}); err != nil || !out.Allowed {
		t.Errorf("Decide() after UNPAUSE = %v, %v, want allowed", out.Allowed, err)
	}
}

func TestBatcherCluster(t *testing.T) {
	cl := redistest.StartCluster(t)
	s := openStore(t, cl.URL(), true)
	if !s.IsCluster() {
		t.Fatalf("Open(%q).IsCluster() = false, want true", cl.URL())
	}
	b := batched(t, s, batchOn)
	m := algo.Meter{Limits: []algo.Limit{dayLimit(algo.FixedWindow, 50)}}
	// Clients spread over every node: each admits exactly its limit.
	var wg sync.WaitGroup
	counts := make([]atomic.Int64, 12)
	for w := range 48 {
		wg.Go(func() {
			for i := range 60 {
				client := (w + i) % len(counts)
				key := fmt.Sprintf("test:{client-%d}", client)
				out, err := b.Decide(context.Background(), algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1})
				if err != nil {
					t.Errorf("Decide(%s) = %v", key, err)
					return
				}
				if out.Allowed {
					counts[client].Add(1)
				}
			}
		})
	}
	wg.Wait()
	for i := range counts {
		if got := counts[i].Load(); got != 50 {
			t.Errorf("client %d admitted %d, want 50", i, got)
		}
	}
	// Keys in two slots do not join a batch (in one script they would fail with
	// CROSSSLOT): they are decided slot by slot, refunds included: the loose
	// limit is charged only for the requests the tight one admitted.
	tight := algo.Meter{Limits: []algo.Limit{dayLimit(algo.FixedWindow, 10)}}
	c := algo.Check{Keys: []string{"test:{slot-a}", "test:{slot-b}"}, Meters: []algo.Meter{m, tight}, Cost: 1}
	if algo.Slot(c.Keys[0]) == algo.Slot(c.Keys[1]) {
		t.Fatalf("keys %v share a slot; pick others", c.Keys)
	}
	if got := hammer(t, b, 8, 5, c); got != 10 {
		t.Errorf("cross-slot decisions admitted %d, want 10", got)
	}
	out, err := b.Decide(context.Background(), algo.Check{Keys: c.Keys[:1], Meters: c.Meters[:1], Cost: 0})
	if err != nil {
		t.Fatalf("Decide(peek) = %v", err)
	}
	if got := out.Decisions[0][0].Remaining; got != 40 {
		t.Errorf("loose limit remaining = %d, want 40 (charged only with the tight one)", got)
	}
}

func TestNewWithOptionsRejectsBadInput(t *testing.T) {
	t.Parallel()
	if _, err := redisstore.NewWithOptions(nil, batchOn); err == nil {
		t.Errorf("NewWithOptions(nil) = nil error, want one")
	}
	s, err := redisstore.Open(redisstore.Config{URL: "redis://127.0.0.1:1"})
	if err != nil {
		t.Fatalf("Open() = %v", err)
	}
	defer s.Close()
	if _, err := redisstore.NewWithOptions(s.Client(), redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: -1}); err == nil {
		t.Errorf("NewWithOptions(MaxBatch -1) = nil error, want one")
	}
	b, err := redisstore.NewWithOptions(s.Client(), batchOn)
	if err != nil {
		t.Fatalf("NewWithOptions() = %v", err)
	}
	// Unreachable Redis: the error comes back to the caller.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	m := algo.Meter{Limits: []algo.Limit{dayLimit(algo.GCRA, 10)}}
	if _, err := b.Decide(ctx, algo.Check{Keys: []string{"k"}, Meters: []algo.Meter{m}, Cost: 1}); err == nil {
		t.Errorf("Decide() on an unreachable Redis = nil error, want one")
	}
}

// TestBatcherManyMatchesModel decides random sequences on 32 keys at once through the
// batcher, which sends what arrives together as one call of the many-request script,
// and requires every decision to be the Go model's for that key.
func TestBatcherManyMatchesModel(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, redisstore.Options{BatchWait: 200 * time.Microsecond})
	ctx := context.Background()
	srv.Do(t, "CONFIG", "RESETSTAT")
	base := time.Now().UnixMicro()
	var wg sync.WaitGroup
	var decisions atomic.Int64
	for w := range 32 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 42))
			// Workers in pairs share a meter, so batches carry requests that share
			// one profile of arguments, and requests that do not.
			a := algo.Algorithms[w/2%len(algo.Algorithms)]
			m := randomMeter(rand.New(rand.NewPCG(uint64(w/2), 7)), a)
			ms := memstore.New(0, nil)
			keys, meters := []string{algo.Key("many:", fmt.Sprint(w), "r", "", "0")}, []algo.Meter{m}
			if w%4 == 3 {
				// every fourth worker adds a second meter of its own, shadow or not:
				// all-or-nothing and shadow inside a batch
				m2 := randomMeter(r, a)
				m2.Shadow = r.IntN(2) == 0
				keys, meters = append(keys, algo.Key("many:", fmt.Sprint(w), "r", "", "1")), append(meters, m2)
			}
			now := base
			for i := range 200 {
				now += step(r, m.Limits[0].Period)
				c := algo.Check{Keys: keys, Meters: meters, Cost: r.Int64N(3), NowMicros: now}
				want, err := ms.Decide(ctx, c)
				if err != nil {
					t.Error(err)
					return
				}
				got, err := b.Decide(ctx, c)
				if err != nil {
					t.Errorf("worker %d (%s) step %d: %v", w, a, i, err)
					return
				}
				decisions.Add(1)
				same := got.Allowed == want.Allowed && len(got.Decisions) == len(want.Decisions)
				for mi := 0; same && mi < len(want.Decisions); mi++ {
					for j := range want.Decisions[mi] {
						same = same && j < len(got.Decisions[mi]) && sameDecision(got.Decisions[mi][j], want.Decisions[mi][j])
					}
				}
				if !same {
					t.Errorf("worker %d (%s %+v) step %d: batched %v %+v, model %v %+v", w, a, meters, i, got.Allowed, got.Decisions, want.Allowed, want.Decisions)
					return
				}
			}
		})
	}
	wg.Wait()
	calls := srv.CommandCalls(t, "fcall")
	t.Logf("%d decisions in %d FCALL calls", decisions.Load(), calls)
	if calls == 0 || calls >= decisions.Load() {
		t.Errorf("%d decisions took %d FCALL calls: nothing was sent together", decisions.Load(), calls)
	}
}

// TestBatcherServerClockTTL checks that batched requests decided on the server's clock
// (which the many entry reads once per batch) keep TTLs without the slack of a caller's
// clock: a key expires when its limit is full again, not a second later.
func TestBatcherServerClockTTL(t *testing.T) {
	srv := redistest.StartServer(t)
	s := openStore(t, srv.URL(), false)
	b := batched(t, s, redisstore.Options{BatchWait: 500 * time.Microsecond})
	srv.Do(t, "CONFIG", "RESETSTAT")
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 1, Period: time.Minute}}}
	const n = 48
	resets := make([]time.Duration, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			c := algo.Check{Keys: []string{algo.Key("ttl:", strconv.Itoa(i), "r", "", "0")}, Meters: []algo.Meter{m}, Cost: 1}
			out, err := b.Decide(context.Background(), c)
			if err != nil || !out.Allowed {
				t.Errorf("request %d: %+v, %v, want allowed", i, out, err)
				return
			}
			resets[i] = out.Decisions[0][0].ResetAfter
		})
	}
	wg.Wait()
	if calls := srv.CommandCalls(t, "fcall"); calls == 0 || calls >= n {
		t.Fatalf("%d requests took %d FCALL calls: nothing was batched", n, calls)
	}
	rc := srv.Client(t)
	for i := range n {
		pttl, err := rc.PTTL(context.Background(), algo.Key("ttl:", strconv.Itoa(i), "r", "", "0")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if pttl <= 0 || pttl > resets[i]+time.Millisecond {
			t.Errorf("request %d: PTTL %v, want at most its reset %v (+1ms rounding)", i, pttl, resets[i])
		}
	}
}
