package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// elsewhere says where the figures that one package measures on its own are: the
// package's tests measure them, and the bench does not again.
const elsewhere = "Redis's script time per call of each algorithm beside redis_rate's script and `return 1`: " +
	"`go test -run '^$' -bench BenchmarkScriptCost ./shared/redisstore/` (redis-µs/call, redis-cpu-µs/call). " +
	"Redis memory per tracked client, per algorithm: `go test -run TestMemoryTable -v ./shared/redisstore/` (the table is logged)."

// writeReport writes report.md, results.json, throughput.svg and README-section.md
// to dir.
func writeReport(dir string, r *results) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	js, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if err := writeChart(filepath.Join(dir, "throughput.svg"), r); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), reportMarkdown(r), 0o644); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	return os.WriteFile(filepath.Join(dir, "README-section.md"), readmeSection(r), 0o644)
}

// find returns the cell of subject on ks at concurrency c, or nil.
func (r *results) find(subject string, ks keyset, c int) *cell {
	for i := range r.Cells {
		x := &r.Cells[i]
		if x.Subject == subject && x.Keyset == ks && x.Conc == c {
			return x
		}
	}
	return nil
}

// ratio returns a/b, or NaN when either is missing.
func ratio(a, b *cell) float64 {
	if a == nil || b == nil || b.Throughput == 0 {
		return math.NaN()
	}
	return a.Throughput / b.Throughput
}

// peer is the subject a cell's throughput is compared with besides the ceiling:
// redis_rate, three redis_rate calls for three limits, Redis-backed denials for the
// deny cache.
func peer(subject string) string {
	if strings.HasPrefix(subject, "denied/") {
		return "denied/redis"
	}
	if strings.Contains(subject, "3-limits") {
		return "redis_rate×3"
	}
	return "redis_rate"
}

// A target is one of the performance goals, evaluated on this run.
type target struct {
	Goal     string
	Measured string
	Status   string // "met", "missed", "not measured"
}

func status(ok bool, measured bool) string {
	switch {
	case !measured:
		return "not measured"
	case ok:
		return "met"
	default:
		return "**missed**"
	}
}

func f1(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

func f2(v float64) string {
	if math.IsNaN(v) {
		return "–"
	}
	return fmt.Sprintf("%.2f", v)
}

func thr(v float64) string {
	switch {
	case math.IsNaN(v):
		return "–"
	case v >= 1e6:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.1fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// targets evaluates the performance goals on the distinct-clients key set (the deny
// cache on the hot client).
func (r *results) targets() []target {
	var ts []target
	rr := func(c int) *cell { return r.find("redis_rate", distinct, c) }
	for _, s := range []string{"engine/gcra", "engine+args/gcra", "engine+batch/gcra"} {
		for _, c := range []int{8, 64} {
			a, b := r.find(s, distinct, c), rr(c)
			x := ratio(a, b)
			ts = append(ts, target{
				Goal:     fmt.Sprintf("%s throughput ≥ 1.0× redis_rate, c=%d", s, c),
				Measured: f2(x) + "×",
				Status:   status(x >= 1.0, !math.IsNaN(x)),
			})
			if a != nil && b != nil {
				ts = append(ts, target{
					Goal:     fmt.Sprintf("%s p99 ≤ redis_rate's, c=%d", s, c),
					Measured: fmt.Sprintf("%s µs vs %s µs", f1(a.P99), f1(b.P99)),
					Status:   status(a.P99 <= b.P99, true),
				})
			}
		}
		a, b := r.find(s, distinct, 1), rr(1)
		if a != nil && b != nil {
			ts = append(ts, target{
				Goal:     fmt.Sprintf("%s allocations per decision ≤ ½ redis_rate's", s),
				Measured: fmt.Sprintf("%s vs %s (c=1)", f1(a.AllocsPerOp), f1(b.AllocsPerOp)),
				Status:   status(a.AllocsPerOp <= b.AllocsPerOp/2, true),
			})
		}
	}
	for _, prefix := range []string{"engine+batch", "engine"} {
		var worst float64 = math.Inf(1)
		var worstName string
		var parts []string
		measured := true
		for _, a := range algo.Algorithms {
			if a == algo.SlidingLog {
				continue
			}
			x := ratio(r.find(prefix+"/"+string(a), distinct, 64), r.find("ceiling", distinct, 64))
			if math.IsNaN(x) {
				measured = false
				continue
			}
			parts = append(parts, fmt.Sprintf("%s %s", a, f2(x)))
			if x < worst {
				worst, worstName = x, string(a)
			}
		}
		ts = append(ts, target{
			Goal:     fmt.Sprintf("%s/* (not sliding_log) ≥ 0.6× ceiling, c=64", prefix),
			Measured: fmt.Sprintf("lowest %s %s× (%s)", worstName, f2(worst), strings.Join(parts, ", ")),
			Status:   status(worst >= 0.6, measured && len(parts) > 0),
		})
	}
	for _, s := range []string{"engine/3-limits", "engine+batch/3-limits"} {
		for _, c := range r.Meta.Conc {
			x := ratio(r.find(s, distinct, c), r.find("redis_rate×3", distinct, c))
			ts = append(ts, target{
				Goal:     fmt.Sprintf("%s ≥ 2× three redis_rate calls, c=%d", s, c),
				Measured: f2(x) + "×",
				Status:   status(x >= 2, !math.IsNaN(x)),
			})
		}
	}
	on, off, args := r.find("engine+batch/gcra", distinct, 64), r.find("engine/gcra", distinct, 64), r.find("engine+args/gcra", distinct, 64)
	x := ratio(on, off)
	ts = append(ts, target{Goal: "batching on ≥ 1.5× batching off (engine/gcra), c=64", Measured: f2(x) + "×", Status: status(x >= 1.5, !math.IsNaN(x))})
	x = ratio(on, args)
	ts = append(ts, target{Goal: "batching on ≥ 1.5× batching off with the same arguments (engine+args/gcra), c=64", Measured: f2(x) + "×", Status: status(x >= 1.5, !math.IsNaN(x))})
	x = ratio(on, rr(64))
	ts = append(ts, target{Goal: "batching on ≥ 2× redis_rate, c=64", Measured: f2(x) + "×", Status: status(x >= 2, !math.IsNaN(x))})
	on1, off1 := r.find("engine+batch/gcra", distinct, 1), r.find("engine/gcra", distinct, 1)
	if on1 != nil && off1 != nil {
		ts = append(ts, target{
			Goal:     "batching on: p50 at c=1 no worse than off (within 5%)",
			Measured: fmt.Sprintf("%s µs vs %s µs", f1(on1.P50), f1(off1.P50)),
			Status:   status(on1.P50 <= off1.P50*1.05, true),
		})
	} else {
		ts = append(ts, target{Goal: "batching on: p50 at c=1 no worse than off", Status: status(false, false)})
	}
	h, eng := r.find("http/gcra", distinct, 1), r.find("engine+batch/gcra", distinct, 1)
	if h != nil && eng != nil {
		ts = append(ts, target{
			Goal:     "decision service over HTTP ≤ engine + 150 µs at p50, c=1",
			Measured: fmt.Sprintf("+%s µs (%s vs %s)", f1(h.P50-eng.P50), f1(h.P50), f1(eng.P50)),
			Status:   status(h.P50-eng.P50 <= 150, true),
		})
	} else {
		ts = append(ts, target{Goal: "decision service over HTTP ≤ engine + 150 µs at p50, c=1", Status: status(false, false)})
	}
	for _, c := range r.Meta.Conc {
		x := ratio(r.find("denied/deny-cache", hot, c), r.find("denied/redis", hot, c))
		ts = append(ts, target{Goal: fmt.Sprintf("deny cache ≥ 50× Redis-backed denials, c=%d", c), Measured: f1(x) + "×", Status: status(x >= 50, !math.IsNaN(x))})
	}
	return ts
}

func reportMarkdown(r *results) []byte {
	var b bytes.Buffer
	m := r.Meta
	fmt.Fprintf(&b, "# tollgate benchmark\n\n")
	if m.Quick {
		fmt.Fprintf(&b, "> **Smoke run (`-quick`)**: cells are too short for the numbers to mean anything.\n\n")
	}
	fmt.Fprintf(&b, "Made by `%s` (`make bench`) on %s.\n\n", m.Command, m.Date)
	fmt.Fprintf(&b, "- Machine: %s, %d CPUs, %s; load average %s before, %s after", m.CPU, m.NumCPU, m.Platform, m.LoadBefore, m.LoadAfter)
	if m.NumCPU <= 2 {
		fmt.Fprintf(&b, " (the bench, redis-server and anything else running share these CPUs)")
	}
	fmt.Fprintf(&b, ".\n")
	fmt.Fprintf(&b, "- Software: %s, Redis %s, %s.\n", m.GoVersion, m.RedisVersion, strings.Join(m.Deps, ", "))
	fmt.Fprintf(&b, "- Method: every contender runs on the same redis-server (loopback, no persistence) and the same go-redis client options (tollgate's `redisstore.Config`: retries off, pool of %d connections). Each cell is %d rounds of %s measured (after %s of warm-up) with N workers in a closed loop; the rounds of all contenders are interleaved, so a burst of load from elsewhere slows them alike, and a cell's throughput is the median of its rounds. Key sets: **distinct** = %d clients round robin, **hot** = one client. Latency is per decision over all rounds (HdrHistogram, 3 significant digits). Allocations are the whole process's (`runtime.MemStats`) per decision; Redis time is `INFO commandstats` (script time) and `INFO cpu` (the process, sockets included).\n", m.PoolSize, m.Rounds, m.Duration, m.Warmup, m.Clients)
	fmt.Fprintf(&b, "- Elsewhere: %s\n\n", elsewhere)

	fmt.Fprintf(&b, "## Targets\n\n| goal | measured | result |\n| --- | --- | --- |\n")
	for _, t := range r.targets() {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", t.Goal, t.Measured, t.Status)
	}

	fmt.Fprintf(&b, "\n## Throughput, %d distinct clients\n\n![decisions per second](throughput.svg)\n\n", m.Clients)
	summaryTable(&b, r, distinct)

	batchingTable(&b, r)

	filterSection(&b, r)

	for _, ks := range []keyset{distinct, hot} {
		fmt.Fprintf(&b, "\n## Every cell: %s\n\n", ksTitle(ks, m.Clients))
		fullTable(&b, r, ks)
	}
	fmt.Fprintf(&b, "\n## Contenders\n\n")
	for _, s := range r.Subjects {
		fmt.Fprintf(&b, "- **%s**: %s.\n", s.Name, s.Desc)
	}
	return b.Bytes()
}

// batchingTable shows what automatic batching does to one gcra limit: today's store
// (one EVALSHA per decision), the batcher with batching off (the same precomputed
// arguments) and with batching on.
func batchingTable(b *bytes.Buffer, r *results) {
	names := []string{"engine/gcra", "engine+args/gcra", "engine+batch/gcra"}
	if r.find(names[2], distinct, r.Meta.Conc[0]) == nil {
		return
	}
	fmt.Fprintf(b, "\n## Automatic batching (one gcra limit, %d distinct clients)\n\n", r.Meta.Clients)
	fmt.Fprintf(b, "`engine/gcra` decides on `redisstore.Store`; `engine+args/gcra` on a `redisstore.Store` with `MaxBatch: 1` (batching off); `engine+batch/gcra` on one batching with the defaults (MaxBatch %d, BatchWait %v).\n\n", redisstore.DefaultMaxBatch, redisstore.DefaultBatchWait)
	fmt.Fprintf(b, "| contender | c | dec/s | × batching off | p50 µs | p99 µs | Redis CPU µs/dec | allocs/dec |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, c := range r.Meta.Conc {
		off := r.find(names[1], distinct, c)
		for _, n := range names {
			x := r.find(n, distinct, c)
			if x == nil {
				continue
			}
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s |\n", n, c, thr(x.Throughput), f2(ratio(x, off)), f1(x.P50), f1(x.P99), f1(x.RedisCPUPerOp), f1(x.AllocsPerOp))
		}
	}
}

func ksTitle(ks keyset, clients int) string {
	if ks == hot {
		return "one hot client"
	}
	return fmt.Sprintf("%d distinct clients", clients)
}

// summaryTable prints, per subject, throughput at every concurrency and the ratios
// at the highest.
func summaryTable(b *bytes.Buffer, r *results, ks keyset) {
	conc := r.Meta.Conc
	top := conc[len(conc)-1]
	fmt.Fprintf(b, "| contender |")
	for _, c := range conc {
		fmt.Fprintf(b, " c=%d dec/s |", c)
	}
	fmt.Fprintf(b, " p50 c=1 (µs) | p99 c=%d (µs) | × ceiling c=%d | × redis_rate c=%d | allocs/dec | Redis CPU µs/dec c=%d |\n|---|", top, top, top, top)
	for range conc {
		fmt.Fprintf(b, "---:|")
	}
	fmt.Fprintf(b, "---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Subjects {
		first := r.find(s.Name, ks, conc[0])
		if first == nil {
			continue
		}
		fmt.Fprintf(b, "| %s |", s.Name)
		for _, c := range conc {
			x := r.find(s.Name, ks, c)
			v := math.NaN()
			if x != nil {
				v = x.Throughput
			}
			fmt.Fprintf(b, " %s |", thr(v))
		}
		t := r.find(s.Name, ks, top)
		fmt.Fprintf(b, " %s | %s | %s | %s | %s | %s |\n", f1(first.P50), f1(t.P99),
			f2(ratio(t, r.find("ceiling", ks, top))), f2(ratio(t, r.find(peer(s.Name), ks, top))),
			f1(first.AllocsPerOp), f1(t.RedisCPUPerOp))
	}
}

func fullTable(b *bytes.Buffer, r *results, ks keyset) {
	fmt.Fprintf(b, "| contender | c | dec/s | p50 µs | p99 µs | p99.9 µs | × ceiling | × peer | allocs/dec | B/dec | script calls/dec | Redis µs/call | Redis CPU µs/dec | errors |\n")
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range r.Subjects {
		for _, c := range r.Meta.Conc {
			x := r.find(s.Name, ks, c)
			if x == nil {
				continue
			}
			errs := fmt.Sprint(x.Errors)
			if x.Errors > 0 {
				errs += ": " + strings.ReplaceAll(truncate(x.FirstErr, 80), "|", "/")
			}
			fmt.Fprintf(b, "| %s | %d | %s | %s | %s | %s | %s | %s | %s | %.0f | %s | %s | %s | %s |\n",
				s.Name, c, thr(x.Throughput), f1(x.P50), f1(x.P99), f1(x.P999),
				f2(ratio(x, r.find("ceiling", ks, c))), f2(ratio(x, r.find(peer(s.Name), ks, c))),
				f1(x.AllocsPerOp), x.BytesPerOp, f2(x.CallsPerOp), f2(x.UsecPerCall), f1(x.RedisCPUPerOp), errs)
		}
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// readmeSection is the README's performance section: the headline table, the chart
// and the command that made them.
func readmeSection(r *results) []byte {
	var b bytes.Buffer
	m := r.Meta
	fmt.Fprintf(&b, "## Performance\n\n")
	fmt.Fprintf(&b, "`make bench` runs tollgate side by side with [go-redis/redis_rate](https://github.com/go-redis/redis_rate) and the raw Redis ceiling (an `EVALSHA` of `return 1`) on one redis-server it starts on loopback, and writes `dist/bench/report.md` (every cell, Redis CPU, allocations) and `dist/bench/throughput.svg`. ")
	fmt.Fprintf(&b, "The figures below come from `%s` on %s (%s, %d CPUs shared by the bench, Redis and other work; load average %s), %s, Redis %s.\n\n", m.Command, m.Date[:10], m.CPU, m.NumCPU, m.LoadBefore, m.GoVersion, m.RedisVersion)
	fmt.Fprintf(&b, "![decisions per second](dist/bench/throughput.svg)\n\n")
	summaryTable(&b, r, distinct)
	fmt.Fprintf(&b, "\n%s\n", elsewhere)
	return b.Bytes()
}
