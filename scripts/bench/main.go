// Command bench runs tollgate side by side with go-redis/redis_rate and the raw
// Redis ceiling (EVALSHA of `return 1`) on one Redis, with the same key sets and
// concurrencies, and writes a Markdown report, a JSON file and a chart to dist/bench/:
// throughput, latency, allocations and Redis's CPU per decision, and the Envoy
// filter's cost in wazero (from wasmfilter's own benchmarks).
//
// What one package measures on its own stays with that package's tests, and the
// report points there: Redis's script time per call is shared/redisstore's
// BenchmarkScriptCost, Redis memory per tracked client its TestMemoryTable.
//
// It starts its own redis-server on a free loopback port (and stops it at the end)
// unless REDIS_URL is set. Paths are the repository root's, wherever it runs from.
// See `make bench` and `go -C scripts run ./bench -h`.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tollgate-dev/tollgate/scripts/internal/redisproc"
	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// config is the bench's configuration, from flags and the environment.
type config struct {
	RedisURL    string        // REDIS_URL; empty: start redis-server
	RedisServer string        // the redis-server binary (-redis-server)
	Out         string        // output directory (-out, default dist/bench)
	Duration    time.Duration // measured time per cell (-duration)
	Warmup      time.Duration // unmeasured time before each cell (-warmup)
	Conc        []int         // concurrencies (-c)
	Clients     int           // distinct clients of the "distinct" key set (-clients)
	Rounds      int           // interleaved rounds per cell (-rounds)
	Only        string        // regexp on subject names (-only)
	FilterReqs  int           // requests per filter benchmark (-filter-requests); 0 skips the filter
	FilterStart int           // VM starts of the filter's start benchmark
	Quick       bool          // smoke run (-quick)
	Render      string        // re-render the report from this results.json (-render)
	Args        []string      // the command line, for the report
}

func defaultConfig() config {
	return config{
		RedisServer: "redis-server",
		Out:         "dist/bench",
		Duration:    time.Second,
		Rounds:      3,
		Warmup:      300 * time.Millisecond,
		Conc:        []int{1, 8, 64},
		Clients:     10000,
		FilterReqs:  100000,
		FilterStart: 20,
	}
}

// quick shrinks the run to a smoke test that CI affords in well under 30 seconds.
func (c *config) quick() {
	c.Quick = true
	c.Duration = 150 * time.Millisecond
	c.Rounds = 1
	c.Warmup = 20 * time.Millisecond
	c.Conc = []int{1, 8}
	c.Clients = 1000
	c.FilterReqs = 100
	c.FilterStart = 2
}

// loadConfig reads the environment through getenv, then the flags in args.
func loadConfig(getenv func(string) string, args []string) (config, error) {
	c := defaultConfig()
	c.RedisURL = getenv("REDIS_URL")
	c.Args = args
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "smoke run: short cells, concurrency 1 and 8, 1,000 clients (CI)")
	fs.StringVar(&c.RedisServer, "redis-server", c.RedisServer, "redis-server binary to start when REDIS_URL is unset")
	fs.StringVar(&c.Out, "out", c.Out, "directory for report.md, results.json, throughput.svg")
	dur := fs.Duration("duration", c.Duration, "measured time per cell and round")
	rounds := fs.Int("rounds", 0, "rounds per cell, interleaved across contenders (default 3)")
	warm := fs.Duration("warmup", c.Warmup, "unmeasured time before each cell")
	conc := fs.String("c", "", "comma-separated concurrencies (default 1,8,64)")
	clients := fs.Int("clients", 0, "distinct clients (default 10000)")
	freqs := fs.Int("filter-requests", -1, "requests per benchmark of the Envoy filter (default 100000; 0 skips the filter)")
	fs.StringVar(&c.Render, "render", "", "write the report from this results.json instead of measuring")
	fs.StringVar(&c.Only, "only", "", "run only the subjects whose name matches this regexp (the Envoy filter: \"filter\")")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *quick {
		c.quick()
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if set["duration"] {
		c.Duration = *dur
	}
	if set["warmup"] {
		c.Warmup = *warm
	}
	if *rounds > 0 {
		c.Rounds = *rounds
	}
	if *clients > 0 {
		c.Clients = *clients
	}
	if *freqs >= 0 {
		c.FilterReqs = *freqs
	}
	if *conc != "" {
		c.Conc = nil
		for _, s := range strings.Split(*conc, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(s))
			if err != nil || n < 1 || n > 4096 {
				return c, fmt.Errorf("-c %q: want comma-separated whole numbers from 1 to 4096", *conc)
			}
			c.Conc = append(c.Conc, n)
		}
	}
	if c.Rounds < 1 {
		return c, fmt.Errorf("-rounds %d: must be at least 1", c.Rounds)
	}
	if c.Duration <= 0 {
		return c, fmt.Errorf("-duration %s: must be positive", c.Duration)
	}
	if c.Only != "" {
		if _, err := regexp.Compile(c.Only); err != nil {
			return c, fmt.Errorf("-only %q: %w", c.Only, err)
		}
	}
	return c, nil
}

func main() {
	cfg, err := loadConfig(os.Getenv, os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if err := repo.Chdir(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var res *results
	if cfg.Render != "" {
		res, err = loadResults(cfg.Render)
	} else {
		res, err = run(ctx, cfg, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if err := writeReport(cfg.Out, res); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s/report.md, results.json, throughput.svg, README-section.md\n", cfg.Out)
}

// loadResults reads the results.json of an earlier run.
func loadResults(path string) (*results, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-render: %w", err)
	}
	var r results
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("-render %s: %w", path, err)
	}
	if len(r.Meta.Conc) == 0 {
		return nil, fmt.Errorf("-render %s: no concurrency levels; is it a results.json of this bench?", path)
	}
	return &r, nil
}

// results is everything one run measured.
type results struct {
	Meta     meta          `json:"meta"`
	Subjects []subjectInfo `json:"subjects"`
	Cells    []cell        `json:"cells"`
	Filter   []filterRow   `json:"filter,omitempty"`
}

type subjectInfo struct {
	Name string `json:"name"`
	Desc string `json:"description"`
}

type meta struct {
	Date         string   `json:"date"`
	Command      string   `json:"command"`
	Quick        bool     `json:"quick"`
	GoVersion    string   `json:"go"`
	Platform     string   `json:"platform"`
	CPU          string   `json:"cpu"`
	NumCPU       int      `json:"cpus"`
	RedisVersion string   `json:"redis"`
	Deps         []string `json:"modules"`
	Duration     string   `json:"cell_duration"`
	Rounds       int      `json:"rounds"`
	Warmup       string   `json:"cell_warmup"`
	Clients      int      `json:"clients"`
	Conc         []int    `json:"concurrency"`
	LoadBefore   string   `json:"loadavg_before"`
	LoadAfter    string   `json:"loadavg_after"`
	PoolSize     int      `json:"redis_pool_size"`
	FilterCount  int      `json:"filter_runs,omitempty"`
}

// run is the bench's core: it starts Redis (unless cfg.RedisURL is set), measures
// every cell and the filter, and stops Redis again. Progress goes to progressOut.
func run(ctx context.Context, cfg config, progressOut io.Writer) (*results, error) {
	url := cfg.RedisURL
	if url == "" {
		srv, err := redisproc.Start(ctx, cfg.RedisServer)
		if err != nil {
			return nil, err
		}
		defer srv.Stop()
		url = srv.URL
	}
	pool := 64
	for _, c := range cfg.Conc {
		pool = max(pool, c)
	}
	store, err := redisstore.Open(redisstore.Config{URL: url, Timeout: 10 * time.Second, PoolSize: pool})
	if err != nil {
		return nil, err
	}
	defer store.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = store.Preload(pctx)
	cancel()
	if err != nil {
		return nil, err
	}
	e := &env{
		cfg:    cfg,
		client: store.Client(),
		store:  store,
		log:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	for i := range cfg.Clients {
		id := fmt.Sprintf("client-%06d", i)
		e.ids = append(e.ids, id)
		e.attrs = append(e.attrs, map[string]string{"api_key": id})
	}

	res := &results{Meta: newMeta(ctx, cfg, e)}
	res.Meta.PoolSize = pool
	var only *regexp.Regexp
	if cfg.Only != "" {
		only = regexp.MustCompile(cfg.Only)
	}
	var plan []subject
	total := 0
	for _, s := range subjects() {
		if only != nil && !only.MatchString(s.Name) {
			continue
		}
		if s.Keysets == nil {
			s.Keysets = []keyset{distinct, hot}
		}
		plan = append(plan, s)
		total += len(s.Keysets) * len(cfg.Conc) * cfg.Rounds
	}
	withFilter := cfg.FilterReqs > 0 && (only == nil || only.MatchString("filter"))
	if withFilter {
		total += 2
	}
	prog := newProgress(progressOut, total)
	defer prog.finish()

	// Every contender is set up first, each with its own key prefix, so that the
	// rounds of one cell can interleave them: a burst of load from elsewhere then
	// slows every contender alike, and the median of the rounds discards it.
	ops := make([]op, len(plan))
	for i, s := range plan {
		res.Subjects = append(res.Subjects, subjectInfo{s.Name, s.Desc})
		e.prefix = fmt.Sprintf("b%d:", i)
		o, closeFn, err := s.setup(e)
		if err != nil {
			return nil, fmt.Errorf("bench: %s: %w", s.Name, err)
		}
		if closeFn != nil {
			defer closeFn()
		}
		ops[i] = o
	}
	for _, ks := range []keyset{distinct, hot} {
		clients := cfg.Clients
		if ks == hot {
			clients = 1
		}
		for _, conc := range cfg.Conc {
			samples := make([][]sample, len(plan))
			for r := range cfg.Rounds {
				for k := range plan {
					i := (k + r) % len(plan) // a different contender leads each round
					s := plan[i]
					if !slices.Contains(s.Keysets, ks) {
						continue
					}
					prog.step(fmt.Sprintf("%s %s c=%d round %d/%d", s.Name, ks, conc, r+1, cfg.Rounds))
					warm := cfg.Warmup
					if r > 0 {
						warm = cfg.Warmup / 4
					}
					sm, err := runRound(ctx, e.client, ops[i], clients, conc, cfg.Duration, warm)
					if err != nil {
						return nil, fmt.Errorf("bench: %s: %w", s.Name, err)
					}
					samples[i] = append(samples[i], sm)
					if err := ctx.Err(); err != nil {
						return nil, err
					}
				}
			}
			for i, s := range plan {
				if len(samples[i]) == 0 {
					continue
				}
				c := summarize(conc, samples[i])
				c.Subject, c.Keyset = s.Name, ks
				res.Cells = append(res.Cells, c)
			}
		}
	}
	if withFilter {
		rows, err := filterRuns(ctx, cfg.FilterStart, cfg.FilterReqs, cfg.Rounds, prog.step)
		if err != nil {
			return nil, err
		}
		res.Filter, res.Meta.FilterCount = rows, cfg.Rounds
	}
	res.Meta.LoadAfter = loadavg()
	return res, nil
}

func newMeta(ctx context.Context, cfg config, e *env) meta {
	m := meta{
		Date:       time.Now().UTC().Format(time.RFC3339),
		Command:    strings.TrimSpace("go -C scripts run ./bench " + strings.Join(cfg.Args, " ")),
		Quick:      cfg.Quick,
		GoVersion:  runtime.Version(),
		Platform:   runtime.GOOS + "/" + runtime.GOARCH,
		CPU:        cpuModel(),
		NumCPU:     runtime.NumCPU(),
		Duration:   cfg.Duration.String(),
		Rounds:     cfg.Rounds,
		Warmup:     cfg.Warmup.String(),
		Clients:    cfg.Clients,
		Conc:       cfg.Conc,
		LoadBefore: loadavg(),
	}
	if info, err := e.client.Info(ctx, "server").Result(); err == nil {
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				m.RedisVersion = v
			}
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/redis/go-redis/v9", "github.com/go-redis/redis_rate/v10":
				m.Deps = append(m.Deps, d.Path+" "+d.Version)
			}
		}
	}
	return m
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}
