package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/scripts/internal/load"
)

// The filter's figures come from its own benchmarks (wasmfilter/bench_test.go), run
// with `go test -bench` so that CI and the bench measure the same code: the module's
// size, a VM's start, the CPU time per request in wazero, the linear memory after
// 1,000 and after all requests, and encoding/json weighed against wasmfilter/internal/jsonv.

// A filterRow is one benchmark of the filter: its metrics (ns/op, allocs/op,
// module-bytes, …), each the median of the runs.
type filterRow struct {
	Name    string             `json:"name"`
	N       int                `json:"n"`
	Metrics map[string]float64 `json:"metrics"`
}

// filterRuns runs the filter's benchmarks: the VM starts vmStarts times, the
// requests requests times (the linear memory is read after them); each count times.
func filterRuns(ctx context.Context, vmStarts, requests, count int, step func(string)) ([]filterRow, error) {
	var rows []filterRow
	for _, run := range []struct {
		bench string
		n     int
	}{
		{"^BenchmarkVMStart$", vmStarts},
		{"^(BenchmarkRequest|BenchmarkJSONReader)$", requests},
	} {
		step(fmt.Sprintf("filter %s, %d× each, %d runs", strings.Trim(run.bench, "^$"), run.n, count))
		cmd := exec.CommandContext(ctx, "go", "test", "-run", "^$", "-bench", run.bench,
			"-benchtime", strconv.Itoa(run.n)+"x", "-count", strconv.Itoa(count), "github.com/tollgate-dev/tollgate/wasmfilter")
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("bench: go test -bench %s ./wasmfilter/: %w\n%s%s", run.bench, err, out, stderr.Bytes())
		}
		rows = append(rows, parseBenchOutput(out)...)
	}
	return rows, nil
}

// parseBenchOutput reads `go test -bench` output: one filterRow per benchmark, with
// the median of each metric over its runs (-count).
func parseBenchOutput(out []byte) []filterRow {
	var order []string
	runs := map[string][]map[string]float64{}
	ns := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") || len(f)%2 != 0 {
			continue
		}
		n, err := strconv.Atoi(f[1])
		if err != nil {
			continue
		}
		name := strings.TrimPrefix(f[0], "Benchmark")
		if i := strings.LastIndexByte(name, '-'); i > 0 {
			if _, err := strconv.Atoi(name[i+1:]); err == nil {
				name = name[:i] // the GOMAXPROCS suffix
			}
		}
		m := map[string]float64{}
		for i := 2; i+1 < len(f); i += 2 {
			if v, err := strconv.ParseFloat(f[i], 64); err == nil {
				m[f[i+1]] = v
			}
		}
		if _, ok := runs[name]; !ok {
			order = append(order, name)
		}
		runs[name] = append(runs[name], m)
		ns[name] = n
	}
	var rows []filterRow
	for _, name := range order {
		row := filterRow{Name: name, N: ns[name], Metrics: map[string]float64{}}
		for unit := range runs[name][0] {
			var vs []float64
			for _, m := range runs[name] {
				if v, ok := m[unit]; ok {
					vs = append(vs, v)
				}
			}
			row.Metrics[unit] = load.Median(vs)
		}
		rows = append(rows, row)
	}
	return rows
}

// filterRow returns the row named name, or nil.
func (r *results) filterRow(name string) *filterRow {
	for i := range r.Filter {
		if r.Filter[i].Name == name {
			return &r.Filter[i]
		}
	}
	return nil
}

// metric returns a metric of the row named name; ok is false when it was not measured.
func (r *results) metric(name, unit string) (float64, bool) {
	row := r.filterRow(name)
	if row == nil {
		return 0, false
	}
	v, ok := row.Metrics[unit]
	return v, ok
}

// filterSection writes the report's section on the Envoy filter.
func filterSection(b *bytes.Buffer, r *results) {
	if len(r.Filter) == 0 {
		return
	}
	fmt.Fprintf(b, "\n## The Envoy filter (compiled to wasm, run in wazero)\n\n")
	fmt.Fprintf(b, "From `go test -run '^$' -bench 'VMStart|Request|JSONReader' ./wasmfilter/` (`wasmfilter/bench_test.go`), in `wasmfilter/internal/wasmhost` on wazero's compiler; each figure is the median of %d runs. "+
		"**jsonv** is the filter as shipped (it reads the callout answers with `wasmfilter/internal/jsonv`), **encjson** the same filter built with `-tags encjson`, which reads them with `encoding/json`. "+
		"A request is its headers (attributes, deny-cache lookup, the callout's body), the callout answered at once by the host (no network), the response's headers and the end of the stream; its time includes wasmhost's side of each host call, and allocs/op are the host's, not the guest's. "+
		"The mix: %s.\n\n", r.Meta.FilterCount, "10,000 distinct API keys, three allowed, one denied by the service (local 429, cached) and one answered from the deny cache in every five requests")
	fmt.Fprintf(b, "| reader | module | compile (once) | instantiate + vm_start + plugin start | linear memory at start |\n| --- | ---: | ---: | ---: | ---: |\n")
	for _, rd := range []string{"jsonv", "encjson"} {
		name := "VMStart/reader=" + rd
		size, ok := r.metric(name, "module-bytes")
		if !ok {
			continue
		}
		comp, _ := r.metric(name, "compile-ms")
		start, _ := r.metric(name, "ns/op")
		lin, _ := r.metric(name, "start-linear-bytes")
		fmt.Fprintf(b, "| %s | %s | %.0f ms | %.2f ms | %s |\n", rd, mib(size), comp, start/1e6, mib(lin))
	}
	fmt.Fprintf(b, "\n| reader | request | µs/request | host allocs/request | linear memory after 1,000 | after all (n) |\n| --- | --- | ---: | ---: | ---: | ---: |\n")
	for _, row := range r.Filter {
		rest, ok := strings.CutPrefix(row.Name, "Request/reader=")
		if !ok {
			continue
		}
		rd, kind, _ := strings.Cut(rest, "/")
		at1k := "—"
		if v, ok := row.Metrics["linear-bytes-1k"]; ok {
			at1k = mib(v)
		}
		fmt.Fprintf(b, "| %s | %s | %.1f | %.0f | %s | %s (%d) |\n", rd, kind, row.Metrics["ns/op"]/1000, row.Metrics["allocs/op"], at1k, mib(row.Metrics["linear-bytes"]), row.N)
	}
	fmt.Fprintf(b, "\nencoding/json against jsonv, interleaved (each op is one request on a VM of each, the order alternating):\n\n| request | jsonv µs | encjson µs | encjson / jsonv |\n| --- | ---: | ---: | ---: |\n")
	for _, kind := range []string{"allowed", "mix"} {
		name := "JSONReader/" + kind
		ratio, ok := r.metric(name, "encjson/jsonv")
		if !ok {
			continue
		}
		j, _ := r.metric(name, "jsonv-ns/req")
		e, _ := r.metric(name, "encjson-ns/req")
		fmt.Fprintf(b, "| %s | %.1f | %.1f | %.2f× |\n", kind, j/1000, e/1000, ratio)
	}
}

// mib formats a byte count in MiB.
func mib(v float64) string { return fmt.Sprintf("%.2f MiB", v/(1<<20)) }
