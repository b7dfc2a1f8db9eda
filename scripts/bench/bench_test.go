package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestQuickRun runs the bench's core in quick mode against a real redis-server, so
// `make test` exercises every contender, the report and the chart. It asserts
// that every cell decided without errors, never how fast.
func TestQuickRun(t *testing.T) {
	srv := redistest.StartServer(t)
	cfg, err := loadConfig(func(string) string { return "" }, []string{"-quick", "-duration", "40ms", "-warmup", "5ms", "-clients", "200", "-filter-requests", "0"})
	if err != nil {
		t.Fatalf("loadConfig() = %v", err)
	}
	cfg.RedisURL = srv.URL()
	cfg.Out = t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := run(ctx, cfg, nil)
	if err != nil {
		t.Fatalf("run() = %v", err)
	}
	if want := len(subjects()); len(res.Subjects) != want {
		t.Errorf("run() measured %d subjects, want %d", len(res.Subjects), want)
	}
	for _, c := range res.Cells {
		if c.Ops == 0 || c.Errors > 0 {
			t.Errorf("cell %s %s c=%d: %d decisions, %d errors (%s), want some and none", c.Subject, c.Keyset, c.Conc, c.Ops, c.Errors, c.FirstErr)
		}
	}
	if err := writeReport(cfg.Out, res); err != nil {
		t.Fatalf("writeReport() = %v", err)
	}
	for _, name := range []string{"report.md", "results.json", "throughput.svg", "README-section.md"} {
		b, err := os.ReadFile(filepath.Join(cfg.Out, name))
		if err != nil || len(b) == 0 {
			t.Errorf("report file %s: %v, %d bytes", name, err, len(b))
		}
	}
	report, _ := os.ReadFile(filepath.Join(cfg.Out, "report.md"))
	for _, want := range []string{"## Targets", "redis_rate", "engine+batch/gcra", "denied/deny-cache", "BenchmarkScriptCost", "TestMemoryTable"} {
		if !strings.Contains(string(report), want) {
			t.Errorf("report.md lacks %q", want)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	env := func(k string) string {
		if k == "REDIS_URL" {
			return "redis://127.0.0.1:6379"
		}
		return ""
	}
	c, err := loadConfig(env, []string{"-c", "2,16", "-duration", "1s"})
	if err != nil {
		t.Fatalf("loadConfig() = %v", err)
	}
	if c.RedisURL != "redis://127.0.0.1:6379" || len(c.Conc) != 2 || c.Conc[1] != 16 || c.Duration != time.Second || c.Clients != 10000 {
		t.Errorf("loadConfig() = %+v, want REDIS_URL, c=2,16, 1s, 10000 clients", c)
	}
	for _, args := range [][]string{{"-c", "0"}, {"-c", "x"}, {"-duration", "0s"}, {"-only", "("}} {
		if _, err := loadConfig(env, args); err == nil {
			t.Errorf("loadConfig(%q) = nil error, want one", args)
		}
	}
}

// TestFilterSection reads `go test -bench` output of the filter's benchmarks, as
// filterRuns does, and writes the report's filter section from it.
func TestFilterSection(t *testing.T) {
	t.Parallel()
	out := []byte(`goos: linux
BenchmarkVMStart/reader=jsonv-2         	      20	   7253646 ns/op	      1132 compile-ms	   3497986 module-bytes	   3473408 start-linear-bytes	 8026763 B/op	   45441 allocs/op
BenchmarkRequest/reader=jsonv/mix-2     	  100000	     72547 ns/op	   8650752 linear-bytes	   8388608 linear-bytes-1k	   16227 B/op	      70 allocs/op
BenchmarkRequest/reader=jsonv/mix-2     	  100000	     70000 ns/op	   8650752 linear-bytes	   8388608 linear-bytes-1k	   16227 B/op	      70 allocs/op
BenchmarkRequest/reader=jsonv/mix-2     	  100000	     90000 ns/op	   8650752 linear-bytes	   8388608 linear-bytes-1k	   16227 B/op	      70 allocs/op
BenchmarkJSONReader/allowed-2           	  100000	    192950 ns/op	    103498 encjson-ns/req	         1.160 encjson/jsonv	     89215 jsonv-ns/req
PASS
`)
	r := &results{Filter: parseBenchOutput(out), Meta: meta{FilterCount: 3}}
	if got, _ := r.metric("Request/reader=jsonv/mix", "ns/op"); got != 72547 {
		t.Errorf("median ns/op of the mix = %v, want 72547", got)
	}
	if got, _ := r.metric("VMStart/reader=jsonv", "module-bytes"); got != 3497986 {
		t.Errorf("module-bytes = %v, want 3497986", got)
	}
	var b bytes.Buffer
	filterSection(&b, r)
	for _, want := range []string{"| jsonv | 3.34 MiB | 1132 ms | 7.25 ms | 3.31 MiB |", "| jsonv | mix | 72.5 | 70 | 8.00 MiB | 8.25 MiB (100000) |", "| allowed | 89.2 | 103.5 | 1.16× |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("filterSection() lacks %q:\n%s", want, b.String())
		}
	}
}
