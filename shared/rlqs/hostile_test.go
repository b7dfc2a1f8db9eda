package rlqs_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

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
	// The heap is the process's: the service's, and the test client's (its
	// 10,000 usages sent, the 2,000 actions it received). Measured 6.5–8.2 MiB;
	// the bound leaves about twice that.
	grew := int64(heap()) - int64(before)
	t.Logf("heap grew %d KiB for 1,000 buckets held and 9,000 dropped", grew/1024)
	if grew > 16<<20 {
		t.Errorf("heap grew %d bytes, want under 16 MiB", grew)
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

// TestBadBucketIDs sends reports whose buckets include refused ids (1 MiB, 100
// entries, empty, an entry over a request attribute's bound) beside good ones: the
// refused buckets' usage is dropped and counted, the good buckets of the same report
// get their assignments, the stream stays open, and the warning is logged once.
func TestBadBucketIDs(t *testing.T) {
	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	c, _ := serveConfig(t, rlqs.Config{Engine: newEngine(t, "redis://"+redistest.StartServer(t).Addr, false, testPolicy), Registerer: reg, Logger: log})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hundred := []string{}
	for i := range 100 {
		hundred = append(hundred, "k"+strconv.Itoa(i), "v")
	}
	bad := []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(1, 0, 0, "tenant", strings.Repeat("x", 1<<20)), // over 4096 bytes
		usage(1, 0, 0, hundred...),                           // over 32 entries
		usage(1, 0, 0),                                       // empty
		usage(1, 0, 0, "tenant", strings.Repeat("y", 2000)),  // over an attribute's 1,024 bytes
	}
	e := openEnvoy(t, ctx, c)
	for i, good := range []string{"ok1", "ok2"} {
		n := e.count()
		e.send(append(bad, usage(1, 0, 0, "tenant", good))...)
		e.waitFor(n + 2) // the good bucket's blanket rule and grant
		e.mu.Lock()
		got := append([]received(nil), e.actions[n:]...)
		e.mu.Unlock()
		for _, r := range got {
			if b := r.action.GetBucketId().GetBucket(); len(b) != 1 || b["tenant"] != good {
				t.Errorf("action for bucket %.80v, want only %q's", b, good)
			}
		}
		if g := grantOf(e.last().action); g < 1 {
			t.Errorf("grant of %q = %d, want at least 1", good, g)
		}
		if got, want := counter(t, reg, "tollgate_rlqs_dropped_total", "bucket_id"), float64(len(bad)*(i+1)); got != want {
			t.Errorf("dropped bucket ids = %v, want %v", got, want)
		}
	}
	time.Sleep(100 * time.Millisecond) // room for a wrong end of the stream
	if err := e.failed(); err != nil {
		t.Errorf("stream ended: %v", err)
	}
	if n := strings.Count(logs.String(), "bucket_id refused"); n != 1 {
		t.Errorf("warnings about refused bucket ids = %d, want 1 per stream:\n%s", n, logs.String())
	}
	for _, want := range []string{"over 4096 bytes", "bucket_id_builder"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("warning %q does not say %q", logs.String(), want)
		}
	}

	t.Run("over the message size", func(t *testing.T) {
		e := openEnvoy(t, ctx, c)
		e.send(usage(1, 0, 0, "tenant", strings.Repeat("x", rlqs.MaxMessageBytes)))
		<-e.done
		if st := status.Convert(e.err); st.Code() != codes.ResourceExhausted {
			t.Errorf("stream ended with %v, want RESOURCE_EXHAUSTED", e.err)
		}
	})
	t.Run("not UTF-8", func(t *testing.T) {
		// gRPC decodes a report before the service reads it, and proto3 strings must
		// be UTF-8: a report with such an id cannot be read at all.
		good, err := proto.Marshal(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, 0, "tenant", "bad~")}})
		if err != nil {
			t.Fatal(err)
		}
		raw := bytes.Replace(good, []byte("bad~"), []byte("bad\xff"), 1)
		st, err := c.StreamRateLimitQuotas(ctx, grpc.ForceCodec(rawCodec{}))
		if err != nil {
			t.Fatal(err)
		}
		if err := st.SendMsg(raw); err != nil {
			t.Fatal(err)
		}
		_, err = st.Recv()
		t.Logf("stream ended with %v", err)
		if got := status.Code(err); got != codes.Internal {
			t.Errorf("stream ended with %v, want INTERNAL (gRPC cannot decode the report)", err)
		}
	})
	t.Run("wrong domain", func(t *testing.T) {
		e := openEnvoy(t, ctx, c)
		if err := e.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "other", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, 0, "tenant", "a")}}); err != nil {
			t.Fatal(err)
		}
		<-e.done
		if st := status.Convert(e.err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), `"fleet"`) {
			t.Errorf("stream ended with %v, want INVALID_ARGUMENT naming the domain", e.err)
		}
	})
}

// lockedBuffer is a bytes.Buffer safe for simultaneous use, for a logger.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
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

// TestTooManyStreams opens one stream more than the service serves: it ends with
// RESOURCE_EXHAUSTED, and the others go on.
func TestTooManyStreams(t *testing.T) {
	c, _ := serveWithMetrics(t, "redis://"+redistest.StartServer(t).Addr, rlqs.Limits{MaxStreams: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, b := openEnvoy(t, ctx, c), openEnvoy(t, ctx, c)
	a.send(usage(0, 1, 0, "tenant", "a"))
	b.send(usage(0, 1, 0, "tenant", "b"))
	a.waitFor(1)
	b.waitFor(1)
	extra := openEnvoy(t, ctx, c)
	// The service may end the stream before this report is sent; gRPC's Send then
	// returns io.EOF and the status comes from Recv.
	err := extra.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(0, 1, 0, "tenant", "c")}})
	if err != nil && err != io.EOF {
		t.Fatal(err)
	}
	<-extra.done
	if st := status.Convert(extra.failed()); st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "2 streams") {
		t.Errorf("the third stream ended with %v, want RESOURCE_EXHAUSTED naming the bound", extra.failed())
	}
	a.send(usage(0, 5, 5*time.Second, "tenant", "a"))
	time.Sleep(100 * time.Millisecond)
	if err := a.failed(); err != nil {
		t.Errorf("a stream within the bound ended: %v", err)
	}
}

// heldStream is a stream in process that the test feeds one report at a time, held
// open until in is closed; it keeps none of the actions sent, so that the heap
// holds only what the service keeps.
type heldStream struct {
	grpc.ServerStream
	ctx context.Context
	in  chan *rlqspb.RateLimitQuotaUsageReports
}

func (h *heldStream) Context() context.Context { return h.ctx }

func (h *heldStream) Recv() (*rlqspb.RateLimitQuotaUsageReports, error) {
	select {
	case r, ok := <-h.in:
		if !ok {
			return nil, io.EOF
		}
		return r, nil
	case <-h.ctx.Done():
		return nil, h.ctx.Err()
	}
}

func (h *heldStream) Send(*rlqspb.RateLimitQuotaResponse) error { return nil }

// gauge returns the value of the named gauge of reg.
func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// TestBucketBytes fills the byte budget of the buckets (Limits.MaxBucketBytes) on
// one stream, with small ids each on a quota of its own, small ids on one quota,
// and ids of 4 KiB each on a quota of its own: buckets past the budget are dropped
// and counted, and the heap the kept ones hold stays within the budget (which
// measures the overheads each bucket and quota is charged). Once the stream ends,
// another keeps as many.
func TestBucketBytes(t *testing.T) {
	url := "redis://" + redistest.StartServer(t).Addr
	pad := func(s string, n int) string { return s + strings.Repeat("x", n-len(s)) }
	for _, tc := range []struct {
		name   string
		budget int64
		n      int // buckets sent, well past the budget
		id     func(i int) []string
	}{
		{"a quota each, small ids", 4 << 20, 4000, func(i int) []string { return []string{"tenant", "t" + strconv.Itoa(i)} }},
		{"one quota, small ids", 4 << 20, 8000, func(i int) []string { return []string{"tenant", "one", "path", "/" + strconv.Itoa(i)} }},
		{"a quota each, 4 KiB ids", 16 << 20, 3000, func(i int) []string {
			return []string{"tenant", pad("t"+strconv.Itoa(i), 1000), "a", pad("", 1000), "b", pad("", 1000), "c", pad("", 1000)}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			srv, err := rlqs.New(rlqs.Config{Engine: newEngine(t, url, false, testPolicy), Registerer: reg, Limits: rlqs.Limits{
				MaxStreamBuckets: 100000, MaxBuckets: 100000, MaxReportRate: 1 << 30, MaxBucketBytes: tc.budget,
			}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			before := heap()
			kept, dropped, held := fillStream(t, ctx, srv, reg, tc.n, tc.id)
			grew := int64(held) - int64(before)
			t.Logf("budget %d KiB: kept %v buckets, dropped %v; the heap grew %d KiB (%.0f%% of the budget, %d bytes a bucket kept)",
				tc.budget>>10, kept, dropped, grew>>10, 100*float64(grew)/float64(tc.budget), grew/int64(kept))
			if grew > tc.budget+tc.budget/8 {
				t.Errorf("the heap grew %d bytes for a budget of %d, want at most an eighth more", grew, tc.budget)
			}
			if again, _, _ := fillStream(t, ctx, srv, reg, tc.n, tc.id); again < kept {
				t.Errorf("a stream after the first ended kept %v buckets, want at least the first's %v (the budget given back)", again, kept)
			}
		})
	}
}

// fillStream sends n buckets (ids of id) on a new stream of srv, 200 a report, and
// returns how many the service kept and dropped past its byte budget, and the live
// heap while the stream held them; then it ends the stream.
func fillStream(t *testing.T, ctx context.Context, srv *rlqs.Server, reg *prometheus.Registry, n int, id func(i int) []string) (kept, dropped float64, held uint64) {
	t.Helper()
	h := &heldStream{ctx: ctx, in: make(chan *rlqspb.RateLimitQuotaUsageReports)}
	ended := make(chan error, 1)
	go func() { ended <- srv.StreamRateLimitQuotas(h) }()
	droppedBefore := counter(t, reg, "tollgate_rlqs_dropped_total", "bytes")
	for i := 0; i < n; i += 200 {
		r := &rlqspb.RateLimitQuotaUsageReports{Domain: "fleet"}
		for j := i; j < min(i+200, n); j++ {
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, usage(1, 0, 0, id(j)...))
		}
		h.in <- r
	}
	waitUntil(t, "every bucket kept or dropped", func() bool {
		return gauge(t, reg, "tollgate_rlqs_buckets")+counter(t, reg, "tollgate_rlqs_dropped_total", "bytes")-droppedBefore == float64(n)
	})
	kept, dropped = gauge(t, reg, "tollgate_rlqs_buckets"), counter(t, reg, "tollgate_rlqs_dropped_total", "bytes")-droppedBefore
	if kept == 0 || dropped == 0 {
		t.Fatalf("kept %v and dropped %v of %d buckets, want both some", kept, dropped, n)
	}
	held = heap()
	close(h.in)
	if err := <-ended; err != nil {
		t.Errorf("stream ended with %v, want a clean end", err)
	}
	if got := gauge(t, reg, "tollgate_rlqs_buckets"); got != 0 {
		t.Errorf("buckets after the stream ended = %v, want 0", got)
	}
	return kept, dropped, held
}

// rawCodec sends []byte as they are, to send a message Go's protobuf would not
// encode, and decodes replies as protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.([]byte); ok {
		return b, nil
	}
	return proto.Marshal(v.(proto.Message))
}

func (rawCodec) Unmarshal(data []byte, v any) error { return proto.Unmarshal(data, v.(proto.Message)) }

func (rawCodec) Name() string { return "proto" }
