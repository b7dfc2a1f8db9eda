// Command callgrind counts the instructions redis-server runs per decision, for every
// algorithm and every path a request can take through the store: a lone request, a
// batch, two meters in one request, a denial, a refund across cluster slots and a
// settlement, with two reference rows (ERL's INCRBY + EXPIRE pipeline and an FCALL of
// a function that returns 1). Redis runs under valgrind --tool=callgrind; each cell is
// a warm-up, then N decisions through redisstore.Store.Decide between a zero and a
// dump of callgrind's counts. See `make callgrind`; the table goes to
// dist/bench/callgrind.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
)

// The reference rows, beside the algorithms.
const (
	refERL   = "erl"
	refFCall = "fcall"
)

var rowTitles = map[string]string{
	refERL:   "ref: ERL's `INCRBY` + `EXPIRE`, pipelined",
	refFCall: "ref: `FCALL` of a function returning 1",
}

// A path is one way a request goes through the store: a column of the table.
type path struct {
	name, title, doc string
}

var paths = []path{
	{"lone", "lone", "one limit, a store without batching, one request at a time."},
	{"new", "lone, new key", "as lone, but each request on a key no request used before: a window's first request (ERL's row: INCRBY + EXPIRE on a new key)."},
	{"batch", "batch of 64", "64 requests of one limit in one call of the library's many entry, as a batching store sends a full batch (algo.ManyCall); per request."},
	{"batched", "batching store", "a store that batches (its default wait, MaxBatch 64) driven by 64 goroutines, one limit per request; per decision made."},
	{"two", "two meters", "two limits in one request, all-or-nothing (checked, then charged), per request."},
	{"denied", "denied", "one limit already exhausted (1 per hour); what a refusal costs."},
	{"refund", "refund (cluster)", "redis-server with cluster-enabled and all 16384 slots on the one node; two limits in two hash-tag slots, the second exhausted, so the first slot is charged, the second denies and the first is refunded: three calls, per request."},
	{"settle", "settle", "a settlement (algo.Check with Settle), never refused; sliding_log cannot settle."},
}

// applies reports whether the row has a cell on path p.
func applies(row, p string) bool {
	switch {
	case row == refERL:
		return p == "lone" || p == "new"
	case row == refFCall:
		return p == "lone"
	case p == "settle":
		return algo.Algorithm(row).CanSettle()
	}
	return true
}

func main() {
	n := flag.Int("n", 1000, "decisions per cell, each on its own client's keys (below 1000, a cell's fixed costs show: ERL's row reads 15,100 at 100, 12,600 at 1000)")
	rows := flag.String("algorithms", strings.Join(allRows(), ","), "rows: algorithms and the references "+refERL+", "+refFCall)
	cols := flag.String("paths", strings.Join(pathNames(), ","), "paths (columns)")
	idle := flag.Duration("idle", 5*time.Second, "how long to measure the idle server's instructions")
	out := flag.String("out", "dist/bench/callgrind.md", "the report")
	flag.Parse()
	err := repo.Chdir()
	if err == nil {
		err = run(*n, split(*rows), split(*cols), *idle, *out)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "callgrind:", err)
		os.Exit(1)
	}
}

func allRows() []string {
	var r []string
	for _, a := range algo.Algorithms {
		r = append(r, string(a))
	}
	return append(r, refERL, refFCall)
}

func pathNames() []string {
	var r []string
	for _, p := range paths {
		r = append(r, p.name)
	}
	return r
}

func split(s string) []string {
	var r []string
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f != "" {
			r = append(r, f)
		}
	}
	return r
}

func run(n int, rows, cols []string, idle time.Duration, out string) error {
	if n < 1 {
		return fmt.Errorf("-n %d: give at least 1 decision per cell", n)
	}
	for _, r := range rows {
		if !slices.Contains(allRows(), r) {
			return fmt.Errorf("-algorithms: unknown row %q; the rows are %s", r, strings.Join(allRows(), ","))
		}
	}
	for _, c := range cols {
		if !slices.Contains(pathNames(), c) {
			return fmt.Errorf("-paths: unknown path %q; the paths are %s", c, strings.Join(pathNames(), ","))
		}
	}
	ctx := context.Background()
	e, err := setup(ctx, slices.Contains(cols, "refund"), idle)
	if err != nil {
		return err
	}
	defer e.close()
	cells := map[[2]string]float64{}
	var t tally
	for _, row := range rows {
		for _, col := range cols {
			if !applies(row, col) {
				continue
			}
			v, err := t.cell(ctx, e, row, col, n)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", row, col, err)
			}
			cells[[2]string{row, col}] = v
		}
	}
	report := "# Redis instructions per decision (callgrind)\n\nMade by `make callgrind` (`go -C scripts run ./callgrind`) on " +
		time.Now().UTC().Format(time.RFC3339) + ".\n\n" + table(rows, cols, cells) + "\n" + method(n, rows, cols, e, t)
	fmt.Print(report)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(out, []byte(report), 0o644)
}

// A tally keeps, across the cells, what the report says of them all.
type tally struct {
	// maxIdle is the largest share of a cell's count that was the idle server's.
	maxIdle float64
	// batchDecisions and batchCalls are the decisions and the FCALLs of the
	// batching store's cells.
	batchDecisions, batchCalls float64
}

// cell measures row on path col: a warm-up, then n requests counted. It returns the
// instructions per decision.
func (t *tally) cell(ctx context.Context, e *env, row, col string, n int) (float64, error) {
	w, err := e.workload(ctx, row, col, n)
	if err != nil {
		return 0, err
	}
	if err := e.awayFromEdge(ctx); err != nil {
		return 0, err
	}
	if _, err := w.run(ctx); err != nil {
		return 0, fmt.Errorf("warm-up: %w", err)
	}
	before, err := redisinfo.Read(ctx, w.g.client)
	if err != nil {
		return 0, err
	}
	c, err := w.g.count(ctx, w.run)
	if err != nil {
		return 0, err
	}
	after, err := redisinfo.Read(ctx, w.g.client)
	if err != nil {
		return 0, err
	}
	if fcall := func(name string) bool { return name == "fcall" || name == "evalsha" }; col == "batched" && after.Sum(fcall).Calls > before.Sum(fcall).Calls {
		// only the rows whose batches are calls of the library (a one-limit
		// fixed_window request is counted with no script)
		t.batchDecisions += float64(c.made)
		t.batchCalls += after.Sum(fcall).Calls - before.Sum(fcall).Calls
	}
	share := c.idle / (c.ir + c.idle)
	t.maxIdle = max(t.maxIdle, share)
	perDecision := c.ir / float64(c.made)
	fmt.Fprintf(os.Stderr, "%-16s %-8s %9.0f instructions per decision (%d decisions; idle %.1f%% of the count, subtracted)\n",
		row, col, perDecision, c.made, 100*share)
	return perDecision, nil
}

// table is the markdown table of the cells, in instructions per decision rounded to 100.
func table(rows, cols []string, cells map[[2]string]float64) string {
	var b strings.Builder
	b.WriteString("| algorithm |")
	for _, p := range paths {
		if slices.Contains(cols, p.name) {
			b.WriteString(" " + p.title + " |")
		}
	}
	b.WriteString("\n| --- |" + strings.Repeat(" ---: |", len(cols)) + "\n")
	for _, row := range rows {
		title := rowTitles[row]
		if title == "" {
			title = "`" + row + "`"
		}
		b.WriteString("| " + title + " |")
		for _, p := range paths {
			if !slices.Contains(cols, p.name) {
				continue
			}
			v, ok := cells[[2]string{row, p.name}]
			if !ok {
				b.WriteString(" — |")
				continue
			}
			b.WriteString(" " + thousands(int64(math.Round(v/100)*100)) + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

// method says how the table was measured.
func method(n int, rows, cols []string, e *env, t tally) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Redis's instructions (callgrind's Ir) per decision: %s under %s --tool=callgrind, on loopback. "+
		"Each cell is a warm-up of the same requests, then N = %d requests on existing keys of distinct clients "+
		"(redisstore.Store.Decide as the engine calls it: the server's clock, cost 1), between `callgrind_control -z` "+
		"and `-d`; the whole server is counted (network, command dispatch, Lua, every thread), less the idle server's "+
		"instructions over the same wall time (%s per second", version("redis-server"), version("valgrind"), n, thousands(int64(e.std.idle)))
	if e.cluster != nil {
		fmt.Fprintf(&b, "; %s in the single-node cluster", thousands(int64(e.cluster.idle)))
	}
	fmt.Fprintf(&b, "; at most %.1f%% of a cell's count)", 100*t.maxIdle)
	b.WriteString(". Limits are per hour, far above what a run sends, except where a denial is measured.\n\n")
	for _, p := range paths {
		if !slices.Contains(cols, p.name) {
			continue
		}
		fmt.Fprintf(&b, "- %s: %s", p.title, p.doc)
		if p.name == "batched" && t.batchCalls > 0 {
			fmt.Fprintf(&b, " Its batches averaged %.1f requests per FCALL here: they form from timing, so this column moves with the machine's load where the others do not.", t.batchDecisions/t.batchCalls)
		}
		b.WriteString("\n")
	}
	if slices.Contains(rows, refERL) {
		b.WriteString("- ERL's row: per decision, a go-redis pipeline of `INCRBY key 1` + `EXPIRE key 3600` (a TTL that outlasts the run, so the key exists, as the tollgate rows' keys do).\n")
	}
	if slices.Contains(rows, refFCall) {
		b.WriteString("- the FCALL row: `FCALL` of a function that returns 1, with one key: what any call of a Redis function costs.\n")
	}
	return b.String()
}

// version is the first line of `binary --version`.
func version(binary string) string {
	b, err := exec.Command(binary, "--version").Output()
	if err != nil {
		return binary + " (version unknown)"
	}
	v, _, _ := strings.Cut(strings.TrimSpace(string(b)), " sha=")
	return v
}

// thousands formats n with a comma every three digits.
func thousands(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}
