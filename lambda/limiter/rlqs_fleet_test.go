package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/internal/envoyrlqs"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// The fleet tests run simulated Envoys (internal/envoyrlqs, which does what
// Envoy's rate_limit_quota filter does) against two limiter processes that
// serve the Rate Limit Quota Service on real Redis, standalone and a
// three-master cluster, and measure what the fleet admits.
//
// Envoy reports every 5 s; the simulated Envoys report every fleetReport so
// that the phases fit in a few seconds each. Every figure below is in
// reporting intervals or windows, not seconds.
const (
	fleetReport = time.Second
	fleetWindow = 2 * time.Second
	fleetLimit  = 4000 // per fleetWindow, shared by the whole fleet
	// fleetDemand is the fleet's total demand, in requests a second: twice
	// the limit's rate, so that the limit binds and shares matter.
	fleetDemand = 2 * fleetLimit / 2.0
)

// fleetWeights skews the Envoys' demand 1:1:2:2:4:4:8:8.
var fleetWeights = []float64{1, 1, 2, 2, 4, 4, 8, 8}

const fleetPolicy = `domain: fleet
rules:
  - name: per-tenant
    match: {tenant: "*"}
    rlqs: {}
    limits: [{algorithm: fixed_window, rate: %d/%s}]
`

// rlqsInstance is one limiter process serving RLQS on grpc.
type rlqsInstance struct {
	p    *process
	grpc string
}

func (i *rlqsInstance) kill() {
	i.p.cmd.Process.Signal(syscall.SIGKILL)
	<-i.p.exited
}

// fleetEnvoy is one simulated Envoy and the load that drives it: rate requests
// a second of one tenant's traffic, paced evenly.
type fleetEnvoy struct {
	name   string
	weight float64
	e      *envoyrlqs.Envoy

	mu      sync.Mutex
	rate    float64
	base    time.Time
	issued  int
	stop    chan struct{}
	stopped chan struct{}
}

func (fe *fleetEnvoy) setRate(r float64) {
	fe.mu.Lock()
	fe.rate, fe.base, fe.issued = r, time.Now(), 0
	fe.mu.Unlock()
}

func (fe *fleetEnvoy) run() {
	defer close(fe.stopped)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	hdr := map[string]string{"x-tenant": "t1"}
	for {
		select {
		case <-fe.stop:
			return
		case <-tick.C:
		}
		fe.mu.Lock()
		due := int(fe.rate*time.Since(fe.base).Seconds()) - fe.issued
		fe.issued += max(due, 0)
		fe.mu.Unlock()
		for range due {
			fe.e.Request(hdr)
		}
	}
}

// leave stops the Envoy's load and closes it (its stream ends), as an Envoy
// that shuts down. Its counts stay readable.
func (fe *fleetEnvoy) leave() {
	close(fe.stop)
	<-fe.stopped
	fe.e.Close()
}

// fleet is one topology's limiters, Redis and Envoys.
type fleet struct {
	t       *testing.T
	redis   []*redistest.Server // every master, to count commands and pause
	insts   []*rlqsInstance
	envoys  []*fleetEnvoy
	phases  []*phase
	windows map[int64]bool // windows some phase asserted on
}

func startFleet(t *testing.T, redisURL string, cluster bool, nodes []*redistest.Server) *fleet {
	t.Helper()
	dir := t.TempDir()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, fmt.Appendf(nil, fleetPolicy, fleetLimit, fleetWindow), 0o600); err != nil {
		t.Fatal(err)
	}
	f := &fleet{t: t, redis: nodes, windows: map[int64]bool{}}
	for range 2 {
		addr := freeAddr(t)
		args := []string{"--listen", "127.0.0.1:0", "--grpc-listen", addr, "--policy", policy, "--redis", redisURL}
		if cluster {
			args = append(args, "--redis-cluster")
		}
		p := startProcess(t, "", nil, args...)
		waitListening(t, addr)
		f.insts = append(f.insts, &rlqsInstance{p: p, grpc: addr})
	}
	return f
}

func waitListening(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %s after 30s: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// addEnvoy starts an Envoy of the given weight whose stream goes to instance
// home first, then to the other.
func (f *fleet) addEnvoy(weight float64, home int) *fleetEnvoy {
	f.t.Helper()
	e, err := envoyrlqs.New(envoyrlqs.Config{
		Domain:         "fleet",
		Servers:        []string{f.insts[home].grpc, f.insts[1-home].grpc},
		BucketID:       map[string]envoyrlqs.Value{"tenant": {Header: "x-tenant"}},
		ReportInterval: fleetReport,
		Window:         fleetWindow,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	fe := &fleetEnvoy{name: fmt.Sprintf("e%d(w%g)", len(f.envoys), weight), weight: weight, e: e,
		stop: make(chan struct{}), stopped: make(chan struct{})}
	f.t.Cleanup(func() {
		select {
		case <-fe.stop:
		default:
			fe.leave()
		}
	})
	f.envoys = append(f.envoys, fe)
	return fe
}

// start sets every listed Envoy's rate to its share of demand (weight/total
// of the active ones, times fleetDemand) and starts the idle ones.
func (f *fleet) setDemand(active []*fleetEnvoy) {
	var total float64
	for _, fe := range active {
		total += fe.weight
	}
	for _, fe := range active {
		fe.setRate(fleetDemand * fe.weight / total)
	}
}

// redisCalls sums the commands every Redis master has run (INFO
// commandstats: every command, those scripts run included, so an upper bound
// on round trips) and, of them, the script calls. Between two readings it
// counts one INFO of its own per master, which phase.end takes off.
func (f *fleet) redisCalls() (all, scripts float64) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, n := range f.redis {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		st, err := redisinfo.Read(ctx, c)
		c.Close()
		if err != nil {
			f.t.Fatalf("INFO on %s: %v", n.Addr, err)
		}
		all += st.Sum(func(string) bool { return true }).Calls
		scripts += st.Sum(func(name string) bool {
			return slices.Contains([]string{"evalsha", "eval", "fcall", "fcall_ro", "evalsha_ro", "eval_ro"}, name)
		}).Calls
	}
	return all, scripts
}

// A phase is a stretch of the run between two events: what each Envoy and the
// fleet admitted in the windows that lie wholly inside it, and what Redis ran.
type phase struct {
	name       string
	from, to   time.Time
	redisFrom  [2]float64
	redisCalls float64 // all commands, less the count's own INFO
	scripts    float64
	windows    []int64
	fleet      map[int64]envoyrlqs.Counts // per window
	perEnvoy   map[string]envoyrlqs.Counts
	active     []*fleetEnvoy // the Envoys with demand in the phase
}

// begin starts a phase now, with active the Envoys that have demand in it.
func (f *fleet) begin(name string, active []*fleetEnvoy) *phase {
	ph := &phase{name: name, from: time.Now(), active: slices.Clone(active)}
	ph.redisFrom[0], ph.redisFrom[1] = f.redisCalls()
	return ph
}

// end ends ph now and reads its counts.
func (f *fleet) end(ph *phase) *phase {
	ph.to = time.Now()
	all, scripts := f.redisCalls()
	ph.redisCalls = all - ph.redisFrom[0] - float64(len(f.redis))
	ph.scripts = scripts - ph.redisFrom[1]
	w := int64(fleetWindow)
	for i := (ph.from.UnixNano() + w - 1) / w; (i+1)*w <= ph.to.UnixNano(); i++ {
		ph.windows = append(ph.windows, i)
	}
	ph.fleet = map[int64]envoyrlqs.Counts{}
	ph.perEnvoy = map[string]envoyrlqs.Counts{}
	for _, fe := range f.envoys {
		var sum envoyrlqs.Counts
		for _, m := range fe.e.Stats() {
			for _, i := range ph.windows {
				c := m[i]
				sum.Admitted += c.Admitted
				sum.Denied += c.Denied
				fc := ph.fleet[i]
				fc.Admitted += c.Admitted
				fc.Denied += c.Denied
				ph.fleet[i] = fc
			}
		}
		ph.perEnvoy[fe.name] = sum
	}
	f.phases = append(f.phases, ph)
	return ph
}

// admitted is the fleet's admissions over the phase's windows.
func (ph *phase) admitted() int64 {
	var n int64
	for _, c := range ph.fleet {
		n += c.Admitted
	}
	return n
}

// maxWindow is the most the fleet admitted in one of the phase's windows.
func (ph *phase) maxWindow() int64 {
	var m int64
	for _, c := range ph.fleet {
		m = max(m, c.Admitted)
	}
	return m
}

// shareErrors returns, for each active Envoy, its share of the phase's
// admissions relative to its share of demand, less one (0: exactly
// proportional).
func (ph *phase) shareErrors() map[string]float64 {
	var wsum float64
	var total int64
	for _, fe := range ph.active {
		wsum += fe.weight
		total += ph.perEnvoy[fe.name].Admitted
	}
	out := map[string]float64{}
	for _, fe := range ph.active {
		got := float64(ph.perEnvoy[fe.name].Admitted) / float64(max(total, 1))
		out[fe.name] = got/(fe.weight/wsum) - 1
	}
	return out
}

// log writes ph as a table: the fleet's admissions per window, then each
// Envoy's.
func (f *fleet) log(ph *phase) {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %q: %d windows of %s, limit %d a window\n", ph.name, len(ph.windows), fleetWindow, fleetLimit)
	fmt.Fprintf(&b, "  window    admitted  denied  of limit\n")
	for _, i := range ph.windows {
		c := ph.fleet[i]
		fmt.Fprintf(&b, "  %-8d  %8d  %6d  %7.1f%%\n", i%100000, c.Admitted, c.Denied, 100*float64(c.Admitted)/fleetLimit)
	}
	errs := ph.shareErrors()
	fmt.Fprintf(&b, "  envoy        admitted  denied  share-vs-demand  server\n")
	for _, fe := range f.envoys {
		c := ph.perEnvoy[fe.name]
		e, ok := errs[fe.name]
		se := "idle"
		if ok {
			se = fmt.Sprintf("%+6.1f%%", 100*e)
		}
		fmt.Fprintf(&b, "  %-11s  %8d  %6d  %15s  %s\n", fe.name, c.Admitted, c.Denied, se, f.instName(fe.e.Server()))
	}
	adm := ph.admitted()
	fmt.Fprintf(&b, "  Redis: %.0f commands (%.0f script calls) for %d admitted: %.4f commands per admitted request",
		ph.redisCalls, ph.scripts, adm, ph.redisCalls/float64(max(adm, 1)))
	f.t.Log(b.String())
}

func (f *fleet) instName(addr string) string {
	for i, in := range f.insts {
		if in.grpc == addr {
			return fmt.Sprintf("tollgate%d", i)
		}
	}
	return "-"
}

// redisPIDs returns the redis-server processes' ids, from INFO server.
func (f *fleet) redisPIDs() []int {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var pids []int
	for _, n := range f.redis {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		pid, err := redisinfo.Int(ctx, c, "server", "process_id")
		c.Close()
		if err != nil {
			f.t.Fatal(err)
		}
		pids = append(pids, int(pid))
	}
	return pids
}

func signalAll(t *testing.T, pids []int, sig syscall.Signal) {
	t.Helper()
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			t.Fatalf("kill(%d, %v): %v", pid, sig, err)
		}
	}
}

func TestRLQSFleet(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		s := redistest.StartServer(t)
		startFleet(t, s.URL(), false, []*redistest.Server{s}).run()
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		c := redistest.StartCluster(t)
		startFleet(t, c.URL(), true, c.Nodes()).run()
	})
}

// fleetOvershoot is how far above the limit the fleet may admit in one window:
// the bound the server states (docs/rlqs.md).
const fleetOvershoot = 0

// checkWindows fails unless every window of ph stayed within the limit plus
// the stated overshoot.
func (f *fleet) checkWindows(ph *phase) {
	f.t.Helper()
	for _, i := range ph.windows {
		if got := ph.fleet[i].Admitted; got > fleetLimit+fleetOvershoot {
			f.t.Errorf("%s: window %d admitted %d, want at most %d (limit %d + stated overshoot %d)",
				ph.name, i, got, fleetLimit+fleetOvershoot, fleetLimit, fleetOvershoot)
		}
	}
}

// checkShares fails unless every active Envoy's share of ph's admissions is
// within 20% of its share of demand.
func (f *fleet) checkShares(ph *phase) {
	f.t.Helper()
	for name, e := range ph.shareErrors() {
		if e < -0.2 || e > 0.2 {
			f.t.Errorf("%s: %s admitted %+.1f%% off its demand-proportional share, want within 20%%", ph.name, name, 100*e)
		}
	}
}

// checkUsed fails unless the fleet admitted at least 80% of the limit in each
// window of ph (demand is twice the limit, so a share left unused shows).
func (f *fleet) checkUsed(ph *phase) {
	f.t.Helper()
	for _, i := range ph.windows {
		if got := ph.fleet[i].Admitted; got < fleetLimit*8/10 {
			f.t.Errorf("%s: window %d admitted %d, want at least %d (80%% of the limit; demand is twice it)", ph.name, i, got, fleetLimit*8/10)
		}
	}
}

// checkRedis fails unless Redis ran at most 0.01 commands per admitted request.
func (f *fleet) checkRedis(ph *phase) {
	f.t.Helper()
	if r := ph.redisCalls / float64(max(ph.admitted(), 1)); r > 0.01 {
		f.t.Errorf("%s: %.4f Redis commands per admitted request (%.0f for %d), want at most 0.01", ph.name, r, ph.redisCalls, ph.admitted())
	}
}

// during runs a phase of d with active Envoys, and logs it.
func (f *fleet) during(name string, active []*fleetEnvoy, d time.Duration) *phase {
	ph := f.begin(name, active)
	time.Sleep(d)
	f.end(ph)
	f.log(ph)
	return ph
}

func (f *fleet) run() {
	t := f.t
	for i, w := range fleetWeights {
		f.addEnvoy(w, i%2)
	}
	active := slices.Clone(f.envoys)
	f.setDemand(active)
	for _, fe := range active {
		go fe.run()
	}

	// Steady: after 3 reporting intervals, the limit is shared by demand.
	time.Sleep(3 * fleetReport)
	steady := f.during("steady", active, 3*fleetWindow)
	f.checkWindows(steady)
	f.checkShares(steady)
	f.checkUsed(steady)
	f.checkRedis(steady)

	// A ninth Envoy joins; the fleet's total demand stays the same.
	newcomer := f.addEnvoy(4, 0)
	active = append(active, newcomer)
	f.setDemand(active)
	go newcomer.run()
	first := f.during("join: first interval", active, fleetReport)
	if got := first.perEnvoy[newcomer.name].Admitted; got < 10 {
		t.Errorf("join: the newcomer admitted %d in its first reporting interval, want a share at once (at least 10)", got)
	}
	time.Sleep(2 * fleetReport)
	joined := f.during("join: after 3 intervals", active, 2*fleetWindow)
	f.checkWindows(joined)
	f.checkShares(joined)
	f.checkUsed(joined)

	// The two busiest Envoys leave: one goes idle, one shuts down. Their
	// share flows to the others within a few intervals.
	idle, gone := active[6], active[7]
	idle.setRate(0)
	gone.leave()
	active = slices.DeleteFunc(slices.Clone(active), func(fe *fleetEnvoy) bool { return fe == idle || fe == gone })
	f.setDemand(active)
	leaving := f.during("leave: first 3 intervals", active, 3*fleetReport)
	f.checkWindows(leaving)
	left := f.during("leave: after 3 intervals", active, 2*fleetWindow)
	f.checkWindows(left)
	f.checkShares(left)
	f.checkUsed(left)

	// tollgate0 dies: its Envoys' streams break and reopen on tollgate1 at
	// their next report.
	f.insts[0].kill()
	killed := f.during("kill: first 3 intervals", active, 3*fleetReport)
	f.checkWindows(killed)
	for _, fe := range active {
		if got := fe.e.Server(); got != f.insts[1].grpc {
			t.Errorf("kill: %s streams to %q, want tollgate1 %s", fe.name, got, f.insts[1].grpc)
		}
	}
	afterKill := f.during("kill: after 3 intervals", active, 2*fleetWindow)
	f.checkWindows(afterKill)
	f.checkShares(afterKill)
	f.checkUsed(afterKill)

	// Redis stops answering for 5 s.
	pids := f.redisPIDs()
	paused := f.begin("redis paused 5s", active)
	signalAll(t, pids, syscall.SIGSTOP)
	time.Sleep(5 * time.Second)
	signalAll(t, pids, syscall.SIGCONT)
	f.end(paused)
	f.log(paused)
	f.checkWindows(paused)
	recovered := f.during("redis back: first 3 intervals", active, 3*fleetReport)
	f.checkWindows(recovered)
	settled := f.during("redis back: after 3 intervals", active, 2*fleetWindow)
	f.checkWindows(settled)
	f.checkShares(settled)
	f.checkUsed(settled)
}
