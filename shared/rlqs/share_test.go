package rlqs_test

import (
	"context"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// envoy is one stream as a test drives it: it sends reports and keeps every
// action the service sends, with when it came.
type envoy struct {
	t  *testing.T
	st rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient

	mu      sync.Mutex
	actions []received
	err     error
	done    chan struct{}
}

type received struct {
	at     time.Time
	action *rlqspb.RateLimitQuotaResponse_BucketAction
}

func openEnvoy(t *testing.T, ctx context.Context, c rlqspb.RateLimitQuotaServiceClient) *envoy {
	t.Helper()
	st, err := c.StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e := &envoy{t: t, st: st, done: make(chan struct{})}
	go func() {
		defer close(e.done)
		for {
			r, err := st.Recv()
			e.mu.Lock()
			if err != nil {
				e.err = err
				e.mu.Unlock()
				return
			}
			for _, a := range r.BucketAction {
				e.actions = append(e.actions, received{time.Now(), a})
			}
			e.mu.Unlock()
		}
	}()
	return e
}

func (e *envoy) send(us ...*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) {
	e.t.Helper()
	if err := e.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: us}); err != nil {
		e.t.Fatal(err)
	}
}

// failed returns the error the stream ended with, or nil while it is open.
func (e *envoy) failed() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.err
}

// count returns how many actions have come.
func (e *envoy) count() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.actions)
}

// waitFor waits until the stream has received n actions, or fails the test.
func (e *envoy) waitFor(n int) {
	e.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for e.count() < n {
		if time.Now().After(deadline) {
			e.t.Fatalf("received %d actions, want %d (stream error %v)", e.count(), n, e.err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// last returns the last action received.
func (e *envoy) last() received {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.actions[len(e.actions)-1]
}

// waitUntil polls cond until it holds, or fails the test after a generous deadline.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still not so after 30s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// nextWindow sleeps until after past the start of the next window of period (our
// clock, as the store numbers windows on this machine) and returns that start.
func nextWindow(period, after time.Duration) time.Time {
	start := time.Now().Truncate(period).Add(period)
	time.Sleep(time.Until(start.Add(after)))
	return start
}

// joinEnvoys opens n Envoys' streams on c, each with its first report of tenant's
// bucket answered.
func joinEnvoys(t *testing.T, ctx context.Context, c rlqspb.RateLimitQuotaServiceClient, tenant string, n int) []*envoy {
	t.Helper()
	var es []*envoy
	for range n {
		e := openEnvoy(t, ctx, c)
		e.send(usage(0, 1, 0, "tenant", tenant))
		e.waitFor(1)
		es = append(es, e)
	}
	return es
}

// windowGrants opens two Envoys' streams on eng for tenant's bucket, has each send
// its first report and then ua and ub, and returns the grants each is pushed at
// the next window's start (of testPolicy's 10 s windows), and the first Envoy.
func windowGrants(t *testing.T, eng *engine.Engine, tenant string, ua, ub *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage) (ga, gb int64, a *envoy) {
	t.Helper()
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	es := joinEnvoys(t, ctx, c, tenant, 2)
	a, bb := es[0], es[1]
	a.send(ua)
	bb.send(ub)
	// Wait for a window's start: both get a push.
	na, nb := a.count(), bb.count()
	start := time.Now()
	waitUntil(t, "a push to both after a window's start", func() bool {
		return a.count() > na && bb.count() > nb && a.last().at.After(start) && bb.last().at.After(start) &&
			a.last().action.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() >= 8*time.Second &&
			bb.last().action.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() >= 8*time.Second
	})
	return grantOf(a.last().action), grantOf(bb.last().action), a
}

// TestSkewedDemand has two Envoys report a demand of 600 and 200 requests per
// second on one tenant: the grants pushed at the next window's start share its
// 6000 units 3 to 1, and the store has charged exactly what was granted.
func TestSkewedDemand(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, testPolicy)
			// Five seconds of demand each, all denied: nothing admitted to charge.
			ga, gb, _ := windowGrants(t, eng, "s", usage(0, 3000, 5*time.Second, "tenant", "s"), usage(0, 1000, 5*time.Second, "tenant", "s"))
			t.Logf("grants at the window's start: %d and %d", ga, gb)
			if ga+gb > 6000 {
				t.Errorf("grants %d + %d = %d, over the limit of 6000", ga, gb, ga+gb)
			}
			if ratio := float64(ga) / float64(max(1, gb)); math.Abs(ratio-3) > 0.15 {
				t.Errorf("grants %d and %d: ratio %.2f, want 3 (demand 600 to 200)", ga, gb, ratio)
			}
			if got := remaining(t, eng, "s"); got != 6000-ga-gb && got != 6000 {
				t.Errorf("remaining = %d, want %d: the store charged exactly the grants (or a new window)", got, 6000-ga-gb)
			}
		})
	}
}

// TestClosedStreamGivesBack closes a stream that holds a grant: its unused units go
// back to the store, for the other Envoys.
func TestClosedStreamGivesBack(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, testPolicy)
			c, _ := serve(t, eng, rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var g int64
			for { // a window with room for a grant of at least 2s
				sctx, scancel := context.WithCancel(ctx)
				e := openEnvoy(t, sctx, c)
				e.send(usage(0, 1, 0, "tenant", "c"))
				e.waitFor(1)
				r := e.last().action
				if ttl := r.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl < 3*time.Second {
					scancel()
					time.Sleep(ttl + time.Second)
					continue
				}
				g = grantOf(r)
				if got := remaining(t, eng, "c"); got != 6000-g {
					t.Fatalf("remaining with the grant = %d, want %d", got, 6000-g)
				}
				if err := e.st.CloseSend(); err != nil {
					t.Fatal(err)
				}
				<-e.done
				scancel()
				break
			}
			if g < 1 {
				t.Fatalf("grant = %d, want at least 1", g)
			}
			waitUntil(t, "the grant given back", func() bool { return remaining(t, eng, "c") == 6000 })
		})
	}
}

// TestSkewedDemandAcrossInstances has two instances on one Redis, each with one
// Envoy, report a demand of 6000 and 2000 requests per second on one tenant: the
// instances see each other's demand through the store, and the grants pushed at a
// window's start share its 6000 units 3 to 1.
func TestSkewedDemandAcrossInstances(t *testing.T) {
	doc := fleetPolicy("{timeout: 2s}", "{reporting_interval: 1s}", "6000/10s")
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.start(t)
			eng1, eng2 := newEngine(t, url, b.cluster, doc), newEngine(t, url, b.cluster, doc)
			c1, _ := serve(t, eng1, rlqs.Limits{})
			c2, _ := serve(t, eng2, rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			a, bb := openEnvoy(t, ctx, c1), openEnvoy(t, ctx, c2)
			a.send(usage(0, 1, 0, "tenant", "x"))
			bb.send(usage(0, 1, 0, "tenant", "x"))
			a.waitFor(1)
			bb.waitFor(1)
			deadline := time.Now().Add(60 * time.Second)
			for {
				// Reports as Envoy sends them, each saying 5s of demand, all denied.
				a.send(usage(0, 30000, 5*time.Second, "tenant", "x"))
				bb.send(usage(0, 10000, 5*time.Second, "tenant", "x"))
				time.Sleep(time.Second)
				la, lb := a.last(), bb.last()
				ttlA := la.action.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
				ttlB := lb.action.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
				ga, gb := grantOf(la.action), grantOf(lb.action)
				// The pushes of one window's start: both live 8s or more.
				if ttlA >= 8*time.Second && ttlB >= 8*time.Second && la.at.Sub(lb.at).Abs() < 2*time.Second {
					ratio := float64(ga) / float64(max(1, gb))
					t.Logf("grants at a window's start: %d and %d (ratio %.2f)", ga, gb, ratio)
					if ga+gb > 6000 {
						t.Fatalf("grants %d + %d = %d, over the limit of 6000", ga, gb, ga+gb)
					}
					if math.Abs(ratio-3) <= 0.6 && ga+gb >= 5000 {
						return
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no window's start shared 3 to 1 within 60s; last grants %d and %d", ga, gb)
				}
			}
		})
	}
}

// TestBrokenStreamKeepsGrant breaks a stream that holds a fresh grant (the client
// goes away without closing its side): its Envoy may still spend the grant until it
// expires, so its units stay charged; a shutdown ends the other streams with
// UNAVAILABLE.
func TestBrokenStreamKeepsGrant(t *testing.T) {
	eng := newEngine(t, "redis://"+redistest.StartServer(t).Addr, false, testPolicy)
	reg := prometheus.NewRegistry()
	c, srv := serveConfig(t, rlqs.Config{Engine: eng, Registerer: reg})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sctx, scancel := context.WithCancel(ctx)
	e := openEnvoy(t, sctx, c)
	e.send(usage(0, 1, 0, "tenant", "k"))
	e.waitFor(1)
	g := grantOf(e.last().action)
	before := remaining(t, eng, "k")
	scancel()
	<-e.done
	// The service has closed the broken stream (its give back done) once it
	// counts no stream open.
	for streams(t, reg) != 0 {
		if ctx.Err() != nil {
			t.Fatal("the broken stream is still counted open")
		}
		time.Sleep(10 * time.Millisecond)
	}
	other := openEnvoy(t, ctx, c)
	other.send(usage(0, 1, 0, "tenant", "other"))
	other.waitFor(1) // the server has served a stream since the break
	if got := remaining(t, eng, "k"); got != before && got != 6000 {
		t.Errorf("remaining after the break = %d, want %d: the grant of %d stays charged (or a new window's 6000)", got, before, g)
	}
	srv.Shutdown()
	<-other.done
	if st := status.Convert(other.failed()); st.Code() != codes.Unavailable {
		t.Errorf("stream after Shutdown ended with %v, want UNAVAILABLE", other.failed())
	}
}

// streams reads the tollgate_rlqs_streams gauge of reg.
func streams(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	return gauge(t, reg, "tollgate_rlqs_streams")
}

// TestLeaveGivesShare has two Envoys on two instances on one Redis ask alike for
// one tenant's limit, whose window is one reporting interval long, beside a third
// that asks next to nothing on the second instance (so that its share stays); when
// the busy one there closes its stream, its instance takes its demand out at once,
// and the other's grant at a window's start is the whole limit within two reporting
// intervals, counted by the store's windows.
func TestLeaveGivesShare(t *testing.T) {
	const limit, interval = 6000, 2 * time.Second
	doc := fleetPolicy("{timeout: 2s}", "{reporting_interval: 2s}", "6000/2s")
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.start(t)
			eng1, eng2 := newEngine(t, url, b.cluster, doc), newEngine(t, url, b.cluster, doc)
			reg2 := prometheus.NewRegistry()
			c1, _ := serve(t, eng1, rlqs.Limits{})
			c2, _ := serveConfig(t, rlqs.Config{Engine: eng2, Registerer: reg2})
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			a, bb, idle := openEnvoy(t, ctx, c1), openEnvoy(t, ctx, c2), openEnvoy(t, ctx, c2)
			a.send(usage(0, 1, 0, "tenant", "l"))
			bb.send(usage(0, 1, 0, "tenant", "l"))
			a.waitFor(1)
			bb.waitFor(1)
			// Each reports every interval, as Envoy does: 15,000 requests a second,
			// all denied (nothing admitted to charge), far over the limit's rate; the
			// idle one 0.5 a second, measured from its first report.
			report := func(e *envoy, stop chan struct{}, denied uint64) {
				for {
					_ = e.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
						usage(0, denied, interval, "tenant", "l"),
					}})
					select {
					case <-stop:
						return
					case <-time.After(interval):
					}
				}
			}
			stopA, stopB, stopIdle := make(chan struct{}), make(chan struct{}), make(chan struct{})
			defer close(stopA)
			defer close(stopIdle)
			go report(a, stopA, 30000)
			bbStopped := make(chan struct{})
			go func() { report(bb, stopB, 30000); close(bbStopped) }()
			go report(idle, stopIdle, 1)
			half := func(g int64) bool { return g >= limit*2/5 && g <= limit*3/5 }
			deadline := time.Now().Add(30 * time.Second)
			// Shared from measured demand: after a few window starts.
			for a.count() < 8 || bb.count() < 8 || !half(grantOf(a.last().action)) || !half(grantOf(bb.last().action)) {
				if time.Now().After(deadline) {
					t.Fatalf("no window's start shared the limit within 30s: grants %v and %v", grants(a), grants(bb))
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Logf("shared: grants %d and %d", grantOf(a.last().action), grantOf(bb.last().action))

			close(stopB)
			<-bbStopped // gRPC forbids CloseSend while a Send is under way on the stream
			if err := bb.st.CloseSend(); err != nil {
				t.Fatal(err)
			}
			<-bb.done
			waitUntil(t, "the busy stream of the second instance closed", func() bool { return streams(t, reg2) == 1 })
			left := window(t, eng1, 2*time.Second)
			// The idle Envoy's part of a window is one unit (6000 × 0.5 / 15,000.5,
			// rounded up), which its instance may take first.
			var got int64
			waitUntil(t, "the whole limit granted to the busy Envoy left", func() bool {
				got = grantOf(a.last().action)
				return got >= limit-1
			})
			whole := window(t, eng1, 2*time.Second)
			t.Logf("the grant was %d, %d window(s) of one interval after the other busy Envoy left", got, whole-left)
			if whole-left > 2 {
				t.Errorf("the whole limit was granted %d reporting intervals after the other Envoy left, want at most 2", whole-left)
			}
		})
	}
}

// window returns the store's window of period now (its clock, Unix µs / period).
func window(t *testing.T, eng *engine.Engine, period time.Duration) int64 {
	t.Helper()
	p, err := eng.Plan(engine.Request{Domain: "fleet", Attributes: map[string]string{"tenant": "l"}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := eng.Peek(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return v.NowMicros / period.Microseconds()
}

// grants returns the grants e received, in order, as units (see grantOf).
func grants(e *envoy) []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []int64
	for _, r := range e.actions {
		out = append(out, grantOf(r.action))
	}
	return out
}

// TestHugeCounts has one Envoy report the largest counts a report can carry beside
// another's 200 requests per second, on a limit of 600 per second: the service
// counts the first's demand up to 100 times the limit's rate, so the second still
// gets its part, 200/(60,000+200) of the window, and the grants stay within it.
func TestHugeCounts(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, testPolicy)
			ga, gb, a := windowGrants(t, eng, "h", usage(math.MaxUint64, math.MaxUint64, time.Second, "tenant", "h"), usage(0, 1000, 5*time.Second, "tenant", "h"))
			t.Logf("grants at the window's start: %d and %d", ga, gb)
			if ga+gb > 6000 {
				t.Errorf("grants %d + %d = %d, over the limit of 6000", ga, gb, ga+gb)
			}
			if want := 6000 * 200.0 / 60200; math.Abs(float64(gb)-want) > 2 {
				t.Errorf("the second Envoy's grant is %d, want %.0f: the first's demand counts up to 100 times the limit's rate", gb, want)
			}
			if err := a.failed(); err != nil {
				t.Errorf("the stream of huge counts ended: %v", err)
			}
		})
	}
}

// TestStalledNodeStallsOnlyItsQuotas pauses the writes of the cluster master that
// holds one tenant's quota while that tenant's first report waits on it: another
// tenant, whose quota is on another master, is answered while the first still
// waits. The service's own lock is never held across a store call, so one slow
// node delays only the quotas it holds.
func TestStalledNodeStallsOnlyItsQuotas(t *testing.T) {
	cl := redistest.StartCluster(t)
	p, err := policy.Parse([]byte(fleetPolicy("{timeout: 10s}", "{}", "6000/10s")))
	if err != nil {
		t.Fatal(err)
	}
	// The store waits as long as the policy does, longer than the pause.
	st, err := redisstore.Open(redisstore.Config{URL: cl.URL(), Cluster: true, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	// The library is loaded on every master before the pause (a first decision
	// would load it, and wait for the paused one).
	if err := st.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	master := func(tenant string) *redistest.Server {
		pl, err := eng.Plan(engine.Request{Domain: "fleet", Attributes: map[string]string{"tenant": tenant}})
		if err != nil {
			t.Fatal(err)
		}
		return cl.MasterForKey(t, pl.Items[0].Key)
	}
	stalled := master("a")
	b := ""
	for i := 0; b == ""; i++ {
		if n := fmt.Sprintf("b%d", i); master(n) != stalled {
			b = n
		}
	}
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ea, eb := openEnvoy(t, ctx, c), openEnvoy(t, ctx, c)
	stalled.Do(t, "client", "pause", "8000", "write")
	t.Cleanup(func() { stalled.Do(t, "client", "unpause") })
	ea.send(usage(0, 1, 0, "tenant", "a"))
	// Let a's grant reach the paused master, and the sweeps run beside it.
	time.Sleep(300 * time.Millisecond)
	eb.send(usage(0, 1, 0, "tenant", b))
	eb.waitFor(1)
	if n := ea.count(); n != 0 {
		t.Fatalf("tenant a was answered (%d answers) before tenant %s: %s waited for a's paused master", n, b, b)
	}
	t.Logf("tenant %s answered while tenant a's master was paused: %v", b, eb.last().action.GetQuotaAssignmentAction().GetRateLimitStrategy())
	stalled.Do(t, "client", "unpause")
	ea.waitFor(1)
}

// TestReportStartsWindow has one Envoy's report arrive just after a window's start,
// before the service's sweep pushes that window's grants: the report starts the
// window for its own bucket, and every other Envoy with demand is still pushed its
// grant at the window's start, not left without one until its own next report
// (which, late in a window, could no longer be answered with a grant that expires
// in time).
func TestReportStartsWindow(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, fleetPolicy("{timeout: 2s}", "{reporting_interval: 1s}", "1000/2s"))
			c, _ := serve(t, eng, rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			es := joinEnvoys(t, ctx, c, "w", 2)
			a, bb := es[0], es[1]
			bb.send(usage(0, 500, time.Second, "tenant", "w"))
			const window = 2 * time.Second
			for range 3 {
				// 30 ms into the next window: past the service's guard on its end,
				// and most likely before its sweep (every 50 ms) has pushed it.
				start := nextWindow(window, 30*time.Millisecond)
				a.send(usage(0, 500, time.Second, "tenant", "w"))
				deadline := time.Now().Add(500 * time.Millisecond)
				for !bb.last().at.After(start) && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
				if last := bb.last(); !last.at.After(start) || grantOf(last.action) <= 0 {
					t.Fatalf("the other Envoy had no grant within 500 ms of the window's start (its last action came %s before it: %v)",
						start.Sub(last.at).Round(time.Millisecond), last.action)
				}
			}
		})
	}
}

// TestShortWindowSharedProRata: when a window's start finds fewer units in the store
// than its Envoys' parts (another instance took more, on its own view of the fleet's
// demand), every Envoy gets the same fraction of its part; none is left without a
// grant for the window while the first ones get all of theirs.
func TestShortWindowSharedProRata(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, fleetPolicy("{timeout: 2s}", "{reporting_interval: 1s}", "1000/2s"))
			c, _ := serve(t, eng, rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			envoys := joinEnvoys(t, ctx, c, "p", 3)
			for _, e := range envoys {
				e.send(usage(0, 1000, 2*time.Second, "tenant", "p")) // 500 a second each
			}
			time.Sleep(200 * time.Millisecond) // the reports are in
			p, err := eng.Plan(engine.Request{Domain: "fleet", Attributes: map[string]string{"tenant": "p"}})
			if err != nil {
				t.Fatal(err)
			}
			const window = 2 * time.Second
			var start time.Time
			for try := 0; ; try++ {
				// Just after the window's start, before the service pushes it (it waits
				// 20 ms past its end): another instance's take leaves 300 of 1000. On a
				// loaded machine the push may come first: then try the next window.
				start = nextWindow(window, 3*time.Millisecond)
				tk, err := eng.Take(ctx, p, 700)
				if err != nil {
					t.Fatal(err)
				}
				if tk.Units == 700 {
					break
				}
				if try == 4 {
					t.Fatalf("the service pushed before a take 3 ms into the window, five windows running (took %d)", tk.Units)
				}
				if err := eng.GiveBack(ctx, p, tk.Units, tk.Verdict.NowMicros); err != nil {
					t.Fatal(err)
				}
			}
			var grants []int64
			var sum int64
			for i, e := range envoys {
				waitUntil(t, fmt.Sprintf("envoy %d pushed a grant for the window", i), func() bool { return e.last().at.After(start) })
				g := grantOf(e.last().action)
				grants = append(grants, g)
				sum += g
			}
			t.Logf("grants of the 300 units left: %v", grants)
			if sum > 300 {
				t.Errorf("grants %v sum to %d, more than the 300 left", grants, sum)
			}
			for i, g := range grants {
				if g < 80 {
					t.Errorf("envoy %d was granted %d of the 300 left (grants %v), want about a third of them each", i, g, grants)
				}
			}
		})
	}
}
