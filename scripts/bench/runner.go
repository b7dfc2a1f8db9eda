package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

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
	res           loopResult
	hist          *hdrhistogram.Histogram
	mallocs       uint64
	bytes         uint64
	before, after redisStats
}

// runRound runs o with conc workers for warmup, then measures it for d.
func runRound(ctx context.Context, rc redis.UniversalClient, o op, clients, conc int, d, warmup time.Duration) (sample, error) {
	var sm sample
	if warmup > 0 {
		loop(ctx, o, clients, conc, warmup, nil)
	}
	hists := make([]*hdrhistogram.Histogram, conc)
	for i := range hists {
		hists[i] = newHist()
	}
	var err error
	if sm.before, err = readRedisStats(ctx, rc); err != nil {
		return sm, err
	}
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	sm.res = loop(ctx, o, clients, conc, d, hists)
	runtime.ReadMemStats(&m1)
	if sm.after, err = readRedisStats(ctx, rc); err != nil {
		return sm, err
	}
	sm.mallocs, sm.bytes = m1.Mallocs-m0.Mallocs, m1.TotalAlloc-m0.TotalAlloc
	sm.hist = newHist()
	for _, h := range hists {
		sm.hist.Merge(h)
	}
	return sm, nil
}

// newHist returns a latency histogram from 100ns to 60s, 3 significant digits.
func newHist() *hdrhistogram.Histogram {
	return hdrhistogram.New(100, int64(60*time.Second), 3)
}

// summarize folds the rounds of one cell: throughput is the median of the rounds'
// (robust to a round that another process slowed down), latency comes from every
// decision of every round, the rest are totals per decision.
func summarize(conc int, rounds []sample) cell {
	c := cell{Conc: conc}
	all := newHist()
	var mallocs, bytes uint64
	var calls, usec, cpu float64
	var thr []float64
	for _, r := range rounds {
		c.Ops += r.res.ops
		c.Errors += r.res.errs
		if c.FirstErr == "" {
			c.FirstErr = r.res.firstErr
		}
		c.Seconds += r.res.elapsed.Seconds()
		all.Merge(r.hist)
		mallocs += r.mallocs
		bytes += r.bytes
		calls += r.after.calls - r.before.calls
		usec += r.after.usec - r.before.usec
		cpu += r.after.cpu - r.before.cpu
		if r.res.elapsed > 0 {
			thr = append(thr, float64(r.res.ops)/r.res.elapsed.Seconds())
		}
	}
	if c.Ops == 0 {
		return c
	}
	n := float64(c.Ops)
	slices.Sort(thr)
	if len(thr)%2 == 1 {
		c.Throughput = thr[len(thr)/2]
	} else {
		c.Throughput = (thr[len(thr)/2-1] + thr[len(thr)/2]) / 2
	}
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

type loopResult struct {
	ops, errs int64
	firstErr  string
	elapsed   time.Duration
}

// loop runs conc workers, each deciding in a closed loop until d has passed. Worker w
// decides for clients w, w+conc, w+2·conc, … (mod clients), so every client is used
// evenly with no shared counter. Latencies go to hists[w] when hists is not nil.
func loop(ctx context.Context, o op, clients, conc int, d time.Duration, hists []*hdrhistogram.Histogram) loopResult {
	var stop atomic.Bool
	var ops, errs atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	t := time.AfterFunc(d, func() { stop.Store(true) })
	defer t.Stop()
	for w := range conc {
		wg.Go(func() {
			var n, bad int64
			i := w % clients
			for !stop.Load() && ctx.Err() == nil {
				t0 := time.Now()
				err := o(ctx, i)
				el := time.Since(t0)
				n++
				if err != nil {
					bad++
					firstErr.CompareAndSwap(nil, err.Error())
				}
				if hists != nil {
					_ = hists[w].RecordValue(int64(el))
				}
				i += conc
				if i >= clients {
					i %= clients
				}
			}
			ops.Add(n)
			errs.Add(bad)
		})
	}
	wg.Wait()
	r := loopResult{ops: ops.Load(), errs: errs.Load(), elapsed: time.Since(start)}
	if v := firstErr.Load(); v != nil {
		r.firstErr = v.(string)
	}
	return r
}
