// Command soak runs the decision service (the built lambda/limiter binary) for a
// while under mixed load on a real redis-server it starts, reloads the policy and
// restarts Redis in the middle, and checks at the end:
//
//   - exact admissions: no fixed_window key admitted more than its limit in a window,
//     and no sliding_log key more than its limit in any sliding window (windows that
//     overlap the Redis restart, which loses the counts, are left out and counted);
//   - no goroutine or RSS growth after warmup (the service's own go_goroutines and
//     process_resident_memory_bytes);
//   - Redis's key count back to its floor (zero) once the TTLs run out, and no key
//     without a TTL at any point it looks.
//
// It writes a Markdown report (-report, default docs/soak/report.md; paths are the
// repository root's, wherever it runs from). See `make soak`.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/scripts/internal/load"
	"github.com/tollgate-dev/tollgate/scripts/internal/redisproc"
	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
)

// The limits the exactness checks know.
const (
	fixedLimit  = 20
	fixedWindow = 2 * time.Second
	logLimit    = 10
	logWindow   = 3 * time.Second
	// A hot limit all clients share, served from leases (fixed_window, exact).
	leasedLimit  = 400
	leasedWindow = time.Second
)

// policyDoc is the soak's policy: every algorithm, keyed by api_key; extra is added
// by the reload.
func policyDoc(extra string) string {
	return fmt.Sprintf(`domain: soak
failure: {mode: closed, timeout: 250ms}
rules:
  - name: fixed
    match: {api_key: "*", path: /fixed}
    limits: [{algorithm: fixed_window, rate: %d/%ds}]
  - name: log
    match: {api_key: "*", path: /log}
    limits: [{algorithm: sliding_log, rate: %d/%ds}]
  - name: mixed
    match: {api_key: "*", path: /mixed}
    limits:
      - {algorithm: gcra, rate: 50/s, burst: 20}
      - {algorithm: token_bucket, rate: 40/s, burst: 30}
      - {algorithm: sliding_window, rate: 100/2s}
  - name: shaped
    match: {api_key: "*", path: /shaped}
    limits: [{algorithm: leaky_bucket, rate: 200/s, burst: 10}]
  - name: ring
    match: {api_key: "*", path: /ring}
    limits:
      - {algorithm: bucket_ring, rate: 30/s, bucket: 100ms}
      - {algorithm: bucket_ring, rate: 100/5s, bucket: 100ms}
  - name: global
    match: {path: /global}
    limits: [{algorithm: gcra, rate: 500/s, burst: 100, lease: {units: 10, for: 20ms}}]
  - name: leased
    match: {path: /leased}
    limits: [{algorithm: fixed_window, rate: %d/%ds, lease: {units: 20, for: 100ms}}]
%s`, fixedLimit, int(fixedWindow.Seconds()), logLimit, int(logWindow.Seconds()), leasedLimit, int(leasedWindow.Seconds()), extra)
}

var paths = []string{"/fixed", "/log", "/mixed", "/shaped", "/ring", "/global", "/leased"}

type config struct {
	duration, warmup time.Duration
	clients          int
	report           string
}

// admission is one request the store admitted.
type admission struct {
	key   string // path and api_key
	at    time.Time
	reset time.Duration // the deciding limit's reset_after
}

func main() {
	var c config
	flag.DurationVar(&c.duration, "duration", 10*time.Minute, "how long the load runs")
	flag.DurationVar(&c.warmup, "warmup", 0, "when growth is measured from (default a tenth of the duration)")
	flag.IntVar(&c.clients, "clients", 32, "closed-loop clients")
	flag.StringVar(&c.report, "report", "docs/soak/report.md", "where the Markdown report goes")
	flag.Parse()
	if c.warmup == 0 {
		c.warmup = c.duration / 10
	}
	if err := repo.Chdir(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	report, err := run(context.Background(), c)
	fmt.Print(report)
	if c.report != "" && report != "" {
		if werr := os.MkdirAll(filepath.Dir(c.report), 0o755); werr == nil {
			werr = os.WriteFile(c.report, []byte(report), 0o644)
			if werr != nil {
				fmt.Fprintln(os.Stderr, "soak:", werr)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, c config) (string, error) {
	tmp, err := os.MkdirTemp("", "tollgate-soak-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	bin := filepath.Join(tmp, "limiter")
	if out, err := exec.Command("go", "build", "-o", bin, "./lambda/limiter").CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the service: %v: %s", err, out)
	}
	srv, err := redisproc.Start(ctx, "redis-server")
	if err != nil {
		return "", err
	}
	defer srv.Stop()
	rc := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(srv.URL, "redis://")})
	defer rc.Close()

	policyFile := filepath.Join(tmp, "policy.yaml")
	if err := os.WriteFile(policyFile, []byte(policyDoc("")), 0o644); err != nil {
		return "", err
	}
	port, err := redisproc.FreePort()
	if err != nil {
		return "", err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	svc := exec.Command(bin, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--policy", policyFile, "--policy-poll", "1s")
	svc.Env = append(os.Environ(), "REDIS_URL="+srv.URL)
	var svcLog bytes.Buffer
	svc.Stderr = &svcLog
	if err := svc.Start(); err != nil {
		return "", err
	}
	defer func() { _ = svc.Process.Kill(); _ = svc.Wait() }()
	if err := waitHealthy(base); err != nil {
		return "", fmt.Errorf("%w; service log: %s", err, svcLog.String())
	}

	// The load: closed-loop clients, each on a key mix of its own; a worker's
	// admissions go to its own slice, joined once the load has stopped.
	var degraded atomic.Int64
	rngs := make([]*rand.Rand, c.clients)
	mine := make([][]admission, c.clients)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(uint64(w), 7))
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.clients}}
	check := func(ctx context.Context, w, _ int) error {
		rng := rngs[w]
		path := paths[rng.IntN(len(paths))]
		// Hot keys: a few shared by every client, over their limits; cold keys:
		// many, each seen now and then.
		key := "hot-" + strconv.Itoa(rng.IntN(4))
		if rng.IntN(3) == 0 {
			key = "cold-" + strconv.Itoa(rng.IntN(5000))
		}
		body := fmt.Sprintf(`{"domain":"soak","attributes":{"api_key":%q,"path":%q}}`, key, path)
		resp, err := client.Post(base+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			return err
		}
		var a struct {
			Allowed      bool  `json:"allowed"`
			Degraded     bool  `json:"degraded"`
			ResetAfterMs int64 `json:"reset_after_ms"`
		}
		err = json.NewDecoder(resp.Body).Decode(&a)
		resp.Body.Close()
		switch {
		case err != nil:
			return fmt.Errorf("decoding an answer: %w", err)
		case a.Degraded:
			degraded.Add(1)
		case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests:
			return errors.New(resp.Status)
		case a.Allowed:
			mine[w] = append(mine[w], admission{key: path + " " + key, at: time.Now(), reset: time.Duration(a.ResetAfterMs) * time.Millisecond})
		}
		return nil
	}
	// The service is ready: every request from the first counts.
	traffic := load.Start(ctx, load.Options{Workers: c.clients}, check)
	defer traffic.Stop() // on an early return
	traffic.Measure()

	start := time.Now()
	var samples []sample
	var immortal []string
	var reloadAt, restartAt, restartDone time.Time
	reloaded, restarted := false, false
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for time.Since(start) < c.duration {
		<-tick.C
		s, err := scrape(base)
		if err != nil {
			return "", err
		}
		s.at = time.Since(start)
		samples = append(samples, s)
		if imm, err := keysWithoutTTL(ctx, rc); err == nil {
			immortal = append(immortal, imm...)
		}
		if !reloaded && time.Since(start) >= c.duration*2/5 {
			reloaded, reloadAt = true, time.Now()
			extra := "  - name: added\n    match: {api_key: \"*\", path: /added}\n    limits: [{algorithm: gcra, rate: 5/s}]\n"
			if err := os.WriteFile(policyFile, []byte(policyDoc(extra)), 0o644); err != nil {
				return "", err
			}
		}
		if !restarted && time.Since(start) >= c.duration*3/5 {
			restarted, restartAt = true, time.Now()
			if err := srv.Restart(ctx); err != nil {
				return "", fmt.Errorf("restarting Redis: %w", err)
			}
			restartDone = time.Now()
		}
	}
	res := traffic.Stop()
	loadTime := res.Elapsed
	admissions := slices.Concat(mine...)
	final, err := scrape(base)
	if err != nil {
		return "", err
	}

	// Keys must expire: the longest TTL is a few windows.
	var drained time.Duration
	var keysLeft int64 = -1
	for t0 := time.Now(); time.Since(t0) < 30*time.Second; time.Sleep(time.Second) {
		n, err := rc.DBSize(ctx).Result()
		if err != nil {
			return "", err
		}
		keysLeft = n
		if n == 0 {
			drained = time.Since(t0)
			break
		}
	}

	fixedOver, fixedWindows, fixedSkipped := checkFixed(admissions, "/fixed", fixedLimit, fixedWindow, false, restartAt, restartDone)
	leasedOver, leasedWindows, leasedSkipped := checkFixed(admissions, "/leased", leasedLimit, leasedWindow, true, restartAt, restartDone)
	logOver, logSkipped := checkSliding(admissions, restartAt, restartDone)
	g0, g1, r0, r1 := growth(samples, c.warmup)

	var problems []string
	if fixedOver > 0 {
		problems = append(problems, fmt.Sprintf("%d fixed_window windows admitted more than %d", fixedOver, fixedLimit))
	}
	if leasedOver > 0 {
		problems = append(problems, fmt.Sprintf("%d windows of the leased limit admitted more than %d", leasedOver, leasedLimit))
	}
	if logOver > 0 {
		problems = append(problems, fmt.Sprintf("%d sliding_log admissions exceeded %d in %v", logOver, logLimit, logWindow))
	}
	if res.Errors > 0 {
		problems = append(problems, fmt.Sprintf("%d requests failed (first: %v)", res.Errors, res.FirstErr))
	}
	if final.reloadsApplied < 1 {
		problems = append(problems, "the policy reload was not applied")
	}
	if g1 > g0+g0/5+5 {
		problems = append(problems, fmt.Sprintf("goroutines grew from %.0f after warmup to %.0f", g0, g1))
	}
	if r1 > r0*1.3 {
		problems = append(problems, fmt.Sprintf("RSS grew from %.1f MiB after warmup to %.1f MiB", r0/(1<<20), r1/(1<<20)))
	}
	if keysLeft != 0 {
		problems = append(problems, fmt.Sprintf("%d Redis keys left 30s after the load", keysLeft))
	}
	if len(immortal) > 0 {
		problems = append(problems, fmt.Sprintf("%d keys without a TTL seen, e.g. %q", len(immortal), immortal[0]))
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# tollgate soak report\n\n")
	fmt.Fprintf(&b, "Run %s: the decision service (lambda/limiter, batching on) on redis-server, %d closed-loop clients over %v, every algorithm, hot keys (4, over their limits) and cold keys (5,000). Policy reloaded at %v (applied: %v), Redis killed and restarted at %v.\n\n",
		start.UTC().Format(time.RFC3339), c.clients, loadTime.Round(time.Second), reloadAt.Sub(start).Round(time.Second), final.reloadsApplied >= 1, restartAt.Sub(start).Round(time.Second))
	fmt.Fprintf(&b, "| figure | value |\n|---|---|\n")
	fmt.Fprintf(&b, "| requests | %d (%.0f/s) |\n", res.Calls, res.Rate())
	fmt.Fprintf(&b, "| admitted | %d |\n", len(admissions))
	fmt.Fprintf(&b, "| failure-mode answers (Redis restarting) | %d |\n", degraded.Load())
	fmt.Fprintf(&b, "| failed requests | %d |\n", res.Errors)
	fmt.Fprintf(&b, "| fixed_window windows checked / over %d / left out (restart) | %d / %d / %d |\n", fixedLimit, fixedWindows, fixedOver, fixedSkipped)
	fmt.Fprintf(&b, "| leased fixed_window (one key for all clients) windows checked / over %d / left out (restart) | %d / %d / %d |\n", leasedLimit, leasedWindows, leasedOver, leasedSkipped)
	fmt.Fprintf(&b, "| sliding_log admissions over %d per %v / left out (restart) | %d / %d |\n", logLimit, logWindow, logOver, logSkipped)
	fmt.Fprintf(&b, "| goroutines after warmup → end | %.0f → %.0f |\n", g0, g1)
	fmt.Fprintf(&b, "| RSS after warmup → end | %.1f → %.1f MiB |\n", r0/(1<<20), r1/(1<<20))
	fmt.Fprintf(&b, "| policy reloads applied / refused | %.0f / %.0f |\n", final.reloadsApplied, final.reloadsRefused)
	fmt.Fprintf(&b, "| Redis keys 30s after the load | %d (drained in %v) |\n", keysLeft, drained.Round(time.Second))
	fmt.Fprintf(&b, "| keys without a TTL seen | %d |\n\n", len(immortal))
	fmt.Fprintf(&b, "Samples (every 5s): time, goroutines, RSS MiB:\n\n```\n")
	for _, s := range samples {
		fmt.Fprintf(&b, "%6.0fs %5.0f %7.1f\n", s.at.Seconds(), s.goroutines, s.rss/(1<<20))
	}
	fmt.Fprintf(&b, "```\n\n")
	if len(problems) == 0 {
		fmt.Fprintf(&b, "Result: **pass**.\n")
		return b.String(), nil
	}
	fmt.Fprintf(&b, "Result: **fail**:\n")
	for _, p := range problems {
		fmt.Fprintf(&b, "- %s\n", p)
	}
	return b.String(), errors.New(strings.Join(problems, "; "))
}

// sample is what the service's /metrics said at one time.
type sample struct {
	at                             time.Duration
	goroutines, rss                float64
	reloadsApplied, reloadsRefused float64
}

func scrape(base string) (sample, error) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	var s sample
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		switch name {
		case "go_goroutines":
			s.goroutines = v
		case "process_resident_memory_bytes":
			s.rss = v
		case `tollgate_policy_reloads_total{result="applied"}`:
			s.reloadsApplied = v
		case `tollgate_policy_reloads_total{result="invalid"}`, `tollgate_policy_reloads_total{result="error"}`:
			s.reloadsRefused += v
		}
	}
	return s, sc.Err()
}

// growth returns goroutines and RSS, averaged over the samples of the first minute
// after warmup and of the last minute.
func growth(ss []sample, warmup time.Duration) (g0, g1, r0, r1 float64) {
	avg := func(sel []sample) (g, r float64) {
		for _, s := range sel {
			g += s.goroutines
			r += s.rss
		}
		return g / float64(len(sel)), r / float64(len(sel))
	}
	var early, late []sample
	end := ss[len(ss)-1].at
	for _, s := range ss {
		if s.at >= warmup && s.at < warmup+time.Minute {
			early = append(early, s)
		}
		if s.at > end-time.Minute {
			late = append(late, s)
		}
	}
	if len(early) == 0 {
		early = ss[:1]
	}
	g0, r0 = avg(early)
	g1, r1 = avg(late)
	return g0, g1, r0, r1
}

// checkFixed counts the admissions of a fixed_window limit on path (per key, or for
// all keys together when global) per epoch-aligned window, and returns the windows
// over limit, the windows checked and those left out because they overlap the Redis
// restart.
func checkFixed(as []admission, path string, limit int, window time.Duration, global bool, from, to time.Time) (over, checked, skipped int) {
	counts := map[string]int{}
	for _, a := range as {
		if !strings.HasPrefix(a.key, path+" ") {
			continue
		}
		// The window is the server's: it ends reset_after after the answer, on a
		// multiple of the window (the client's clock reads the answer a little late).
		end := a.at.Add(a.reset).UnixNano()
		w := int64(math.Round(float64(end)/float64(window))) - 1
		start := time.Unix(0, w*int64(window))
		if start.Before(to.Add(time.Second)) && start.Add(window).After(from.Add(-time.Second)) {
			skipped++
			continue
		}
		k := a.key
		if global {
			k = path
		}
		counts[k+"@"+strconv.FormatInt(w, 10)]++
	}
	for _, n := range counts {
		checked++
		if n > limit {
			over++
		}
	}
	return over, checked, skipped
}

// checkSliding counts the /log admissions that had logLimit others of the same key
// in the logWindow before them (outside the restart).
func checkSliding(as []admission, from, to time.Time) (over, skipped int) {
	byKey := map[string][]time.Time{}
	for _, a := range as {
		if strings.HasPrefix(a.key, "/log ") {
			byKey[a.key] = append(byKey[a.key], a.at)
		}
	}
	// Client-side times trail the server's decisions by the answer's trip, so the
	// window is narrowed by a margin that covers it.
	const margin = 50 * time.Millisecond
	for _, ts := range byKey {
		slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
		for i, t := range ts {
			if t.After(from.Add(-logWindow)) && t.Before(to.Add(logWindow)) {
				skipped++
				continue
			}
			j := i - logLimit
			if j >= 0 && t.Sub(ts[j]) < logWindow-margin {
				over++
			}
		}
	}
	return over, skipped
}

// keysWithoutTTL samples up to 1,000 keys and returns those without a TTL.
func keysWithoutTTL(ctx context.Context, rc *redis.Client) ([]string, error) {
	keys, _, err := rc.Scan(ctx, 0, "*", 1000).Result()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, k := range keys {
		if ttl, err := rc.PTTL(ctx, k).Result(); err == nil && ttl == -1*time.Nanosecond {
			out = append(out, k)
		}
	}
	return out, nil
}

func waitHealthy(base string) error {
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return errors.New("the service was not ready within 15s")
}
