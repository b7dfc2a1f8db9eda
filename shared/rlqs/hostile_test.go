package rlqs_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// serveWithMetrics is serve with the service's metrics on a registry of its own.
func serveWithMetrics(t *testing.T, url string, limits rlqs.Limits) (rlqspb.RateLimitQuotaServiceClient, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	c, _ := serveConfig(t, rlqs.Config{Engine: newEngine(t, url, false, testPolicy), Limits: limits, Registerer: reg})
	return c, reg
}

// heap returns the bytes of live heap after a collection.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestManyBuckets sends one report of 10,000 buckets: the service answers the
// first 1,000 (a stream's cap), drops the rest with a count, keeps the stream, and
// holds a bounded amount of memory.
func TestManyBuckets(t *testing.T) {
	c, reg := serveWithMetrics(t, "redis://"+redistest.StartServer(t).Addr, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := heap()
	e := openEnvoy(t, ctx, c)
	us := make([]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, 10000)
	for i := range us {
		us[i] = usage(1, 0, 0, "tenant", "t"+strconv.Itoa(i))
	}
	e.send(us...)
	e.waitFor(rlqs.DefaultMaxStreamBuckets)
	if got := counter(t, reg, "tollgate_rlqs_dropped_total", "buckets"); got != 9000 {
		t.Errorf("dropped buckets = %v, want 9000", got)
	}
	// The stream still answers.
	e.send(usage(0, 5, 5*time.Second, "tenant", "t1"))
	time.Sleep(100 * time.Millisecond)
	if err := e.failed(); err != nil {
		t.Errorf("stream ended: %v", err)
	}
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB for 1,000 buckets held and 9,000 dropped", grew/1024)
	if grew > 64<<20 {
		t.Errorf("heap grew %d bytes, want under 64 MiB", grew)
	}
}

// counter returns the value of the named counter vector's counter with the label
// value, 0 when it has none.
func counter(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetValue() == label {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// TestHugeBucketID sends a bucket id of 1 MiB: the stream ends with
// INVALID_ARGUMENT naming the bound.
func TestHugeBucketID(t *testing.T) {
	c, _ := serveWithMetrics(t, "redis://"+redistest.StartServer(t).Addr, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		u    *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage
		want string
	}{
		{"1 MiB value", usage(1, 0, 0, "tenant", strings.Repeat("x", 1<<20)), "over 4096 bytes"},
		{"100 entries", func() *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
			kv := []string{}
			for i := range 100 {
				kv = append(kv, "k"+strconv.Itoa(i), "v")
			}
			return usage(1, 0, 0, kv...)
		}(), "at most 32"},
		{"empty", usage(1, 0, 0), "bucket_id.bucket is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := openEnvoy(t, ctx, c)
			e.send(tc.u)
			<-e.done
			if st := status.Convert(e.err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), tc.want) {
				t.Errorf("stream ended with %v, want INVALID_ARGUMENT saying %q", e.err, tc.want)
			}
		})
	}
	t.Run("over the message size", func(t *testing.T) {
		e := openEnvoy(t, ctx, c)
		e.send(usage(1, 0, 0, "tenant", strings.Repeat("x", rlqs.MaxMessageBytes)))
		<-e.done
		if st := status.Convert(e.err); st.Code() != codes.ResourceExhausted {
			t.Errorf("stream ended with %v, want RESOURCE_EXHAUSTED", e.err)
		}
	})
}

// TestReportFlood sends 20,000 reports as fast as the stream takes them: those past
// the stream's rate are dropped with a count, the stream stays, and memory stays
// bounded.
func TestReportFlood(t *testing.T) {
	c, reg := serveWithMetrics(t, "redis://"+redistest.StartServer(t).Addr, rlqs.Limits{MaxReportRate: 100})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before := heap()
	e := openEnvoy(t, ctx, c)
	for i := range 20000 {
		e.send(usage(1, 0, time.Second, "tenant", "f"+strconv.Itoa(i%10)))
	}
	waitUntil(t, "the flood's reports dropped", func() bool {
		return counter(t, reg, "tollgate_rlqs_dropped_total", "rate") > 10000
	})
	if err := e.failed(); err != nil {
		t.Errorf("stream ended: %v", err)
	}
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB over 20,000 reports; dropped %v", grew/1024, counter(t, reg, "tollgate_rlqs_dropped_total", "rate"))
	if grew > 32<<20 {
		t.Errorf("heap grew %d bytes, want under 32 MiB", grew)
	}
}
