package rls_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// benchConfig is make bench-erl's configuration: 10,000 clients at 100 per second.
const benchConfig = "domain: bench\ndescriptors:\n  - key: client\n    rate_limit: {unit: second, requests_per_unit: 100}\n"

// BenchmarkShouldRateLimit decides make bench-erl's requests over gRPC on loopback,
// on a real redis-server with batching, from GOMAXPROCS×8 clients: the service's
// cost per decision, gRPC included, for profiling (-cpuprofile) what bench-erl
// measures against envoyproxy/ratelimit.
func BenchmarkShouldRateLimit(b *testing.B) {
	tr, err := erl.Translate([]byte(benchConfig))
	if err != nil {
		b.Fatal(err)
	}
	p, err := policy.Parse(tr.Policy)
	if err != nil {
		b.Fatal(err)
	}
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + redistest.StartServer(b).Addr, BatchWait: redisstore.DefaultBatchWait})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	c := serve(b, rls.New(eng, nil))
	var next atomic.Int64
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			n := next.Add(1) % 10000
			req := &rlsv3.RateLimitRequest{Domain: "bench", HitsAddend: 1, Descriptors: []*rlv3.RateLimitDescriptor{{
				Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "client", Value: "c-" + strconv.FormatInt(n, 10)}},
			}}}
			if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
