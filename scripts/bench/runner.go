package main

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/scripts/internal/load"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
)

// A cell is one subject on one key set at one concurrency.
type cell struct {
	Subject  string  `json:"subject"`
	Keyset   keyset  `json:"keyset"`
	Conc     int     `json:"concurrency"`
	Ops      int64   `json:"decisions"`
	Errors   int64   `json:"errors"`
	FirstErr string  `json:"first_error,omitempty"`
	Seconds  float64 `json:"seconds"`
	// Throughput is decisions per second.
	Throughput float64 `json:"decisions_per_second"`
	// Latency percentiles of one decision, in microseconds.
	P50  float64 `json:"p50_us"`
	P99  float64 `json:"p99_us"`
	P999 float64 `json:"p999_us"`
	Max  float64 `json:"max_us"`
	// Go heap allocations per decision, the whole process (HTTP: client and server).
	AllocsPerOp float64 `json:"allocs_per_decision"`
	BytesPerOp  float64 `json:"bytes_per_decision"`
	// Redis script calls (EVALSHA, EVAL, FCALL, FCALL_RO) per decision, and Redis's own time per call
	// (INFO commandstats usec/calls).
	CallsPerOp  float64 `json:"redis_calls_per_decision"`
	UsecPerCall float64 `json:"redis_usec_per_call"`
	// RedisCPUPerOp is the Redis process's CPU time (user + sys, INFO cpu) per
	// decision, in microseconds: script time plus reading and writing the sockets.
	RedisCPUPerOp float64 `json:"redis_cpu_us_per_decision"`
}

// redisStats is what the bench reads from INFO before and after a cell.
type redisStats struct {
	calls, usec float64 // script commands
	cpu         float64 // seconds, user + sys
}

func readRedisStats(ctx context.Context, c redis.UniversalClient) (redisStats, error) {
	st, err := redisinfo.Read(ctx, c)
	if err != nil {
		return redisStats{}, fmt.Errorf("bench: %w", err)
	}
	scripts := st.Sum(func(name string) bool {
		switch name {
		case "evalsha", "eval", "fcall", "fcall_ro":
			return true
		}
		return false
	})
	return redisStats{calls: scripts.Calls, usec: scripts.Usec, cpu: st.CPU}, nil
}

// A sample is one round of one cell: what runRound measured.
type sample struct {
	res           load.Result
	mallocs       uint64
	bytes         uint64
	before, after redisStats
}

// runRound runs o with conc workers for warmup, then measures it for d: the Redis
// figures and the heap's allocations are read on either side of the window, while
// no decision is in flight.
func runRound(ctx context.Context, rc redis.UniversalClient, o op, clients, conc int, d, warmup time.Duration) (sample, error) {
	var sm sample
	run := load.Start(ctx, load.Options{Workers: conc, Clients: clients}, func(ctx context.Context, _, i int) error { return o(ctx, i) })
	time.Sleep(warmup)
	run.Hold()
	runtime.GC()
	// The heap is read last, so that the INFO reply's allocations stay out of it.
	var err error
	if sm.before, err = readRedisStats(ctx, rc); err != nil {
		run.Stop()
		return sm, err
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	run.Measure()
	time.Sleep(d)
	sm.res = run.Stop()
	runtime.ReadMemStats(&m1)
	if sm.after, err = readRedisStats(ctx, rc); err != nil {
		return sm, err
	}
	sm.mallocs, sm.bytes = m1.Mallocs-m0.Mallocs, m1.TotalAlloc-m0.TotalAlloc
	return sm, nil
}

// summarize folds the rounds of one cell: throughput is the median of the rounds'
// (robust to a round that another process slowed down), latency comes from every
// decision of every round, the rest are totals per decision.
func summarize(conc int, rounds []sample) cell {
	c := cell{Conc: conc}
	all := load.NewHistogram()
	var mallocs, bytes uint64
	var calls, usec, cpu float64
	var thr []float64
	for _, r := range rounds {
		c.Ops += r.res.Calls
		c.Errors += r.res.Errors
		if c.FirstErr == "" && r.res.FirstErr != nil {
			c.FirstErr = r.res.FirstErr.Error()
		}
		c.Seconds += r.res.Elapsed.Seconds()
		all.Merge(r.res.Latency)
		mallocs += r.mallocs
		bytes += r.bytes
		calls += r.after.calls - r.before.calls
		usec += r.after.usec - r.before.usec
		cpu += r.after.cpu - r.before.cpu
		if r.res.Elapsed > 0 {
			thr = append(thr, r.res.Rate())
		}
	}
	if c.Ops == 0 {
		return c
	}
	n := float64(c.Ops)
	c.Throughput = load.Median(thr)
	us := func(v int64) float64 { return float64(v) / 1e3 }
	c.P50, c.P99, c.P999, c.Max = us(all.ValueAtQuantile(50)), us(all.ValueAtQuantile(99)), us(all.ValueAtQuantile(99.9)), us(all.Max())
	c.AllocsPerOp = float64(mallocs) / n
	c.BytesPerOp = float64(bytes) / n
	// The INFO calls that bracket a round are not scripts; nothing to subtract.
	c.CallsPerOp = calls / n
	if calls > 0 {
		c.UsecPerCall = usec / calls
	}
	c.RedisCPUPerOp = cpu * 1e6 / n
	return c
}
