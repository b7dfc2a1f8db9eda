package engine_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// benchPolicy is one rule per api_key with the given limits, far above what a
// benchmark sends, so every decision is a charge.
func benchPolicy(b *testing.B, denyCache bool, limits ...string) *policy.Policy {
	b.Helper()
	src := fmt.Sprintf("domain: bench\nshard_by: api_key\nfailure: {mode: closed, timeout: 5s}\ndeny_cache: {enabled: %v}\nrules:\n  - name: r\n    match: {api_key: \"*\"}\n    limits:\n", denyCache)
	for _, l := range limits {
		src += "      - " + l + "\n"
	}
	p, err := policy.Parse([]byte(src))
	if err != nil {
		b.Fatalf("policy.Parse() = %v", err)
	}
	return p
}

func benchEngine(b *testing.B, st engine.Store, p *policy.Policy) *engine.Engine {
	b.Helper()
	e, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		b.Fatalf("engine.New() = %v", err)
	}
	return e
}

func benchAttrs(n int) []map[string]string {
	attrs := make([]map[string]string, n)
	for i := range attrs {
		attrs[i] = map[string]string{"api_key": fmt.Sprintf("client-%06d", i)}
	}
	return attrs
}

func openBenchStore(b *testing.B) *redisstore.Store {
	b.Helper()
	srv := redistest.StartServer(b)
	s, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 5 * time.Second, PoolSize: 64})
	if err != nil {
		b.Fatalf("redisstore.Open() = %v", err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Preload(context.Background()); err != nil {
		b.Fatalf("Preload() = %v", err)
	}
	return s
}

// check decides one request and fails the benchmark on anything but an admission.
func check(b *testing.B, e *engine.Engine, attrs map[string]string) {
	v, err := e.Check(context.Background(), engine.Request{Domain: "bench", Attributes: attrs, Cost: 1})
	if err != nil || v.Degraded || !v.Allowed {
		b.Fatalf("Check() = %+v, %v, want allowed", v, err)
	}
}

// BenchmarkCheck decides one request at a time through the engine on Redis: the
// latency and the allocations of one decision, per store.
func BenchmarkCheck(b *testing.B) {
	s := openBenchStore(b)
	attrs := benchAttrs(10000)
	gcra := "{algorithm: gcra, rate: 1000000/s}"
	three := []string{gcra, "{algorithm: gcra, rate: 60000000/min}", "{algorithm: gcra, rate: 3600000000/h}"}
	for _, tc := range []struct {
		name   string
		limits []string
	}{
		{"gcra", []string{gcra}},
		{"fixed_window", []string{"{algorithm: fixed_window, rate: 1000000/s}"}},
		{"token_bucket", []string{"{algorithm: token_bucket, rate: 1000000/s}"}},
		{"3-limits", three},
	} {
		for _, st := range []struct {
			name string
			o    *redisstore.Options
		}{{"store", nil}, {"unbatched", &redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: 1}}, {"batcher", &redisstore.Options{BatchWait: redisstore.DefaultBatchWait}}} {
			b.Run(tc.name+"/"+st.name, func(b *testing.B) {
				var store engine.Store = s
				if st.o != nil {
					bt, err := redisstore.NewWithOptions(s.Client(), *st.o)
					if err != nil {
						b.Fatal(err)
					}
					store = bt
				}
				e := benchEngine(b, store, benchPolicy(b, true, tc.limits...))
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					check(b, e, attrs[i%len(attrs)])
				}
			})
		}
	}
}

// BenchmarkCheckParallel is BenchmarkCheck for gcra with 64 requests in flight.
func BenchmarkCheckParallel(b *testing.B) {
	s := openBenchStore(b)
	attrs := benchAttrs(10000)
	for _, st := range []struct {
		name string
		o    *redisstore.Options
	}{{"store", nil}, {"unbatched", &redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: 1}}, {"batcher", &redisstore.Options{BatchWait: redisstore.DefaultBatchWait}}} {
		b.Run("gcra/"+st.name, func(b *testing.B) {
			var store engine.Store = s
			if st.o != nil {
				bt, err := redisstore.NewWithOptions(s.Client(), *st.o)
				if err != nil {
					b.Fatal(err)
				}
				store = bt
			}
			e := benchEngine(b, store, benchPolicy(b, true, "{algorithm: gcra, rate: 1000000/s}"))
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					check(b, e, attrs[int(next.Add(1))%len(attrs)])
				}
			})
		})
	}
}

// BenchmarkCheckInProcess is the engine's own cost, without Redis: the in-process
// store decides.
func BenchmarkCheckInProcess(b *testing.B) {
	attrs := benchAttrs(10000)
	e := benchEngine(b, nil, benchPolicy(b, true, "{algorithm: gcra, rate: 1000000/s}"))
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		check(b, e, attrs[i%len(attrs)])
	}
}

// BenchmarkDenyCache decides for a blocked client: answered from the deny cache, or
// (deny cache off) by a Redis round trip each time.
func BenchmarkDenyCache(b *testing.B) {
	s := openBenchStore(b)
	attrs := map[string]string{"api_key": "blocked"}
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("cache=%v", on), func(b *testing.B) {
			e := benchEngine(b, s, benchPolicy(b, on, "{algorithm: gcra, rate: 1/h}"))
			ctx := context.Background()
			req := engine.Request{Domain: "bench", Attributes: attrs, Cost: 1}
			for range 2 {
				if _, err := e.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			for b.Loop() {
				v, err := e.Check(ctx, req)
				if err != nil || v.Allowed || v.Cached != on {
					b.Fatalf("Check() = %+v, %v, want denied, cached %v", v, err, on)
				}
			}
		})
	}
}
