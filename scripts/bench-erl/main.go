// Command bench-erl runs envoyproxy/ratelimit (ERL, built from the Go module proxy)
// and tollgate's gRPC RateLimitService side by side on one redis-server, with the same
// fixed-window configuration (ERL's YAML, which tollgate loads as it is), and drives
// both with the same gRPC client at several concurrencies: decisions per second,
// p50/p99 latency, server CPU and Redis CPU per decision. Rounds alternate between the
// two. See `make bench-erl`; the report goes to dist/bench/erl.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate-dev/tollgate/scripts/internal/load"
	"github.com/tollgate-dev/tollgate/scripts/internal/redisproc"
	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// erlModule is the ERL version the module proxy serves (only pseudo-versions are listed).
const erlModule = "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"

// config is ERL's configuration both serve: 10,000 clients of 100 per second each, a
// fixed window, as ERL counts.
const config = `domain: bench
descriptors:
  - key: client
    rate_limit:
      unit: second
      requests_per_unit: 100
`

const clients = 10000

type subject struct {
	name string
	cmd  *exec.Cmd
	addr string
	conn *grpc.ClientConn
}

// result is one round of one subject at one concurrency.
type result struct {
	decisions           int64
	seconds             float64
	p50, p99            time.Duration
	serverCPU, redisCPU float64 // seconds
	clientCPU           float64 // seconds: this process, the gRPC client
	// redisCalls and redisCmdSecs are the commands Redis ran and the time INFO
	// commandstats gives them (scripts' inner commands included in the script's)
	redisCalls   int64
	redisCmdSecs float64
}

func main() {
	conc := flag.String("c", "1,8,64", "concurrencies")
	dur := flag.Duration("duration", 3*time.Second, "measured time per round")
	rounds := flag.Int("rounds", 5, "rounds per subject and concurrency")
	out := flag.String("out", "dist/bench/erl.md", "the report")
	flag.Parse()
	err := repo.Chdir()
	if err == nil {
		err = run(*conc, *dur, *rounds, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench-erl:", err)
		os.Exit(1)
	}
}

func run(concList string, dur time.Duration, rounds int, out string) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "tollgate-bench-erl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	erlBin, err := buildERL(tmp)
	if err != nil {
		return err
	}
	tgBin := filepath.Join(tmp, "limiter")
	if b, err := exec.Command("go", "build", "-o", tgBin, "./lambda/limiter").CombinedOutput(); err != nil {
		return fmt.Errorf("building tollgate: %v: %s", err, b)
	}
	srv, err := redisproc.Start(ctx, "redis-server")
	if err != nil {
		return err
	}
	defer srv.Stop()
	redisAddr := strings.TrimPrefix(srv.URL, "redis://")
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	defer rc.Close()

	cfgDir := filepath.Join(tmp, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(config), 0o644); err != nil {
		return err
	}
	ports := make([]int, 5)
	for i := range ports {
		if ports[i], err = redisproc.FreePort(); err != nil {
			return err
		}
	}
	erl := &subject{name: "envoyproxy/ratelimit", addr: "127.0.0.1:" + strconv.Itoa(ports[0])}
	erl.cmd = exec.Command(erlBin)
	erl.cmd.Env = append(baseEnv(), "GRPC_PORT="+strconv.Itoa(ports[0]), "PORT="+strconv.Itoa(ports[1]), "DEBUG_PORT="+strconv.Itoa(ports[2]),
		"RUNTIME_ROOT="+filepath.Join(tmp, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=error", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr)
	tg := &subject{name: "tollgate", addr: "127.0.0.1:" + strconv.Itoa(ports[3])}
	tg.cmd = exec.Command(tgBin, "--listen", "127.0.0.1:"+strconv.Itoa(ports[4]), "--grpc-listen", tg.addr,
		"--erl-config", cfgDir, "--policy", "lambda/policy.yaml")
	tg.cmd.Env = append(baseEnv(), "REDIS_URL="+srv.URL)
	for _, s := range []*subject{erl, tg} {
		if err := s.cmd.Start(); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
		defer func() { _ = s.cmd.Process.Kill(); _ = s.cmd.Wait() }()
		if s.conn, err = grpc.NewClient(s.addr, grpc.WithTransportCredentials(insecure.NewCredentials())); err != nil {
			return err
		}
		defer s.conn.Close()
		if err := waitServing(s); err != nil {
			return err
		}
	}

	var concs []int
	for _, f := range strings.Split(concList, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-c %q: want concurrencies such as 1,8,64", concList)
		}
		concs = append(concs, n)
	}
	results := map[string]map[int][]result{erl.name: {}, tg.name: {}}
	for _, c := range concs {
		for r := range rounds {
			for _, s := range []*subject{erl, tg} {
				res, err := round(ctx, s, rc, c, dur)
				if err != nil {
					return fmt.Errorf("%s c=%d round %d: %w", s.name, c, r+1, err)
				}
				results[s.name][c] = append(results[s.name][c], res)
				fmt.Fprintf(os.Stderr, "%s c=%d: %.0f decisions/s\n", s.name, c, float64(res.decisions)/res.seconds)
			}
		}
	}
	report := write(results, erl.name, tg.name, concs, dur, rounds)
	fmt.Print(report)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(report), 0o644)
}

// baseEnv is this process's environment without what would change either service
// from the defaults the report states: GOGC, GOMEMLIMIT, and tollgate's, ERL's
// response headers' and Redis's settings (each service gets its Redis address from
// the bench).
func baseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "GOGC", name == "GOMEMLIMIT", strings.HasPrefix(name, "TOLLGATE_"),
			strings.HasPrefix(name, "LIMIT_"), strings.HasPrefix(name, "REDIS_"):
			continue
		}
		env = append(env, kv)
	}
	return env
}

// buildERL installs ERL's service_cmd from the module proxy into dir.
func buildERL(dir string) (string, error) {
	mod := filepath.Join(dir, "erl-build")
	if err := os.MkdirAll(mod, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "install", erlModule)
	cmd.Dir = mod
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=-mod=mod", "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building envoyproxy/ratelimit (%s): %v: %s", erlModule, err, b)
	}
	return filepath.Join(dir, "service_cmd"), nil
}

func request(client int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlv3.RateLimitDescriptor{{
		Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c-" + strconv.Itoa(client)}},
	}}}
}

func waitServing(s *subject) error {
	c := rlsv3.NewRateLimitServiceClient(s.conn)
	var err error
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = c.ShouldRateLimit(ctx, request(0))
		cancel()
		if err == nil {
			return nil
		}
	}
	return fmt.Errorf("%s did not answer within 20s: %v", s.name, err)
}

// round drives s at concurrency c for d after a short warmup, reading the
// processes' CPU time and Redis's INFO on either side of the measured window, while
// no decision is in flight.
func round(ctx context.Context, s *subject, rc *redis.Client, c int, d time.Duration) (result, error) {
	client := rlsv3.NewRateLimitServiceClient(s.conn)
	run := load.Start(ctx, load.Options{Workers: c, Clients: clients}, func(ctx context.Context, _, i int) error {
		_, err := client.ShouldRateLimit(ctx, request(i))
		return err
	})
	time.Sleep(300 * time.Millisecond)
	run.Hold()
	cpu0, ccpu0 := procCPU(s.cmd.Process.Pid), procCPU(os.Getpid())
	redis0, err0 := redisinfo.Read(ctx, rc)
	run.Measure()
	time.Sleep(d)
	res := run.Stop()
	cpu1, ccpu1 := procCPU(s.cmd.Process.Pid), procCPU(os.Getpid())
	redis1, err1 := redisinfo.Read(ctx, rc)
	if res.FirstErr != nil {
		return result{}, fmt.Errorf("%d of %d decisions failed, e.g. %w", res.Errors, res.Calls, res.FirstErr)
	}
	if err := errors.Join(err0, err1); err != nil {
		return result{}, err
	}
	notInfo := func(name string) bool { return name != "info" }
	before, after := redis0.Sum(notInfo), redis1.Sum(notInfo)
	us := func(q float64) time.Duration { return time.Duration(res.Latency.ValueAtQuantile(q)) }
	return result{decisions: res.Calls, seconds: res.Elapsed.Seconds(), p50: us(50), p99: us(99),
		serverCPU: cpu1 - cpu0, redisCPU: redis1.CPU - redis0.CPU, clientCPU: ccpu1 - ccpu0,
		redisCalls: int64(after.Calls - before.Calls), redisCmdSecs: (after.Usec - before.Usec) / 1e6}, nil
}

// procCPU is a process's user and system CPU time, in seconds, from /proc.
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // clock ticks; 100 per second on Linux
}

func write(results map[string]map[int][]result, erl, tg string, concs []int, d time.Duration, rounds int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# tollgate vs envoyproxy/ratelimit over gRPC\n\n")
	fmt.Fprintf(&b, "Same redis-server, same configuration (ERL's YAML: 10,000 clients at 100 per second, fixed window), same gRPC client; %d interleaved rounds of %v per cell; medians of the rounds. ERL %s with USE_STATSD=false and DISABLE_STATS=true and its other defaults (Go's GOGC=100 among them); tollgate's limiter with --erl-config and its defaults (batching on, a queue waits at most %v behind a round trip; GOGC=400); neither gets this process's GOGC, GOMEMLIMIT, TOLLGATE_*, LIMIT_* or REDIS_* variables. Redis CPU is INFO cpu's; Redis commands counts every command INFO commandstats lists (tollgate counts a one-limit fixed_window request with no script: INCRBY, and PEXPIREAT on a window it has not counted in yet; a script's call would count once plus the commands it runs), and command µs is their time there (a script's time includes its commands').\n\n", rounds, d, strings.TrimPrefix(erlModule, "github.com/envoyproxy/ratelimit/src/service_cmd@"), redisstore.DefaultBatchWait)
	fmt.Fprintf(&b, "| c | subject | decisions/s | p50 (µs) | p99 (µs) | server CPU µs/decision | Redis CPU µs/decision | Redis commands/decision | command µs/decision | client CPU µs/decision | × ERL decisions/s |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	median := func(rs []result, f func(result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		return load.Median(v)
	}
	for _, c := range concs {
		base := median(results[erl][c], func(r result) float64 { return float64(r.decisions) / r.seconds })
		for _, name := range []string{erl, tg} {
			rs := results[name][c]
			rate := median(rs, func(r result) float64 { return float64(r.decisions) / r.seconds })
			fmt.Fprintf(&b, "| %d | %s | %.0f | %.0f | %.0f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", c, name, rate,
				median(rs, func(r result) float64 { return float64(r.p50.Microseconds()) }),
				median(rs, func(r result) float64 { return float64(r.p99.Microseconds()) }),
				median(rs, func(r result) float64 { return r.serverCPU * 1e6 / float64(max(1, r.decisions)) }),
				median(rs, func(r result) float64 { return r.redisCPU * 1e6 / float64(max(1, r.decisions)) }),
				median(rs, func(r result) float64 { return float64(r.redisCalls) / float64(max(1, r.decisions)) }),
				median(rs, func(r result) float64 { return r.redisCmdSecs * 1e6 / float64(max(1, r.decisions)) }),
				median(rs, func(r result) float64 { return r.clientCPU * 1e6 / float64(max(1, r.decisions)) }),
				rate/base)
		}
	}
	// The machine's other load moves both subjects from round to round: the ratio of
	// each pair of rounds (run back to back) shows how far one run's median can move.
	fmt.Fprintf(&b, "\n× ERL decisions/s round by round (each tollgate round over the ERL round before it):\n\n")
	for _, c := range concs {
		var rs []string
		for i, r := range results[tg][c] {
			if i < len(results[erl][c]) {
				e := results[erl][c][i]
				rs = append(rs, fmt.Sprintf("%.2f", (float64(r.decisions)/r.seconds)/(float64(e.decisions)/e.seconds)))
			}
		}
		fmt.Fprintf(&b, "- c=%d: %s\n", c, strings.Join(rs, ", "))
	}
	return b.String()
}
