package envoyrlqs

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// fakeClock is a Clock the test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// fakeServer is a tiny RLQS server: it hands each stream to the test, which
// reads the reports and sends responses itself.
type fakeServer struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer
	addr    string
	streams chan *fakeStream
	srv     *grpc.Server
}

type fakeStream struct {
	reports chan *rlqspb.RateLimitQuotaUsageReports
	send    chan *rlqspb.RateLimitQuotaResponse
	end     chan struct{} // closed by the test: the server ends the stream
}

func startFake(t *testing.T) *fakeServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{addr: ln.Addr().String(), streams: make(chan *fakeStream, 8), srv: grpc.NewServer()}
	rlqspb.RegisterRateLimitQuotaServiceServer(f.srv, f)
	go f.srv.Serve(ln)
	t.Cleanup(f.srv.Stop)
	return f
}

func (f *fakeServer) StreamRateLimitQuotas(s grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	fs := &fakeStream{
		reports: make(chan *rlqspb.RateLimitQuotaUsageReports, 64),
		send:    make(chan *rlqspb.RateLimitQuotaResponse),
		end:     make(chan struct{}),
	}
	f.streams <- fs
	go func() {
		for {
			r, err := s.Recv()
			if err != nil {
				return
			}
			fs.reports <- r
		}
	}()
	for {
		select {
		case r := <-fs.send:
			if err := s.Send(r); err != nil {
				return err
			}
		case <-fs.end:
			return nil
		case <-s.Context().Done():
			return nil
		}
	}
}

func (f *fakeServer) nextStream(t *testing.T) *fakeStream {
	t.Helper()
	select {
	case s := <-f.streams:
		return s
	case <-time.After(5 * time.Second):
		t.Fatal("no stream opened within 5s")
		return nil
	}
}

func (s *fakeStream) nextReport(t *testing.T) *rlqspb.RateLimitQuotaUsageReports {
	t.Helper()
	select {
	case r := <-s.reports:
		return r
	case <-time.After(5 * time.Second):
		t.Fatal("no report within 5s")
		return nil
	}
}

// respond sends r and waits until e has processed it.
func (s *fakeStream) respond(t *testing.T, e *Envoy, r *rlqspb.RateLimitQuotaResponse) {
	t.Helper()
	n := e.Responses()
	s.send <- r
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.WaitResponses(ctx, n+1); err != nil {
		t.Fatal(err)
	}
}

var tenantA = map[string]string{"tenant": "a"}

// newEnvoy returns an Envoy on a fake clock, with manual reports, whose bucket
// id is {tenant: header x-tenant}.
func newEnvoy(t *testing.T, cfg Config) (*Envoy, *fakeClock) {
	t.Helper()
	clock := &fakeClock{now: time.Unix(1_000_000, 0)}
	cfg.Domain = "d"
	cfg.BucketID = map[string]Value{"tenant": {Header: "x-tenant"}}
	cfg.ReportInterval = -1
	cfg.Clock = clock
	e, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e, clock
}

// withBucket returns an Envoy on a fake server whose bucket of tenant a has
// made its first request, been reported, and so has a stream.
func withBucket(t *testing.T, cfg Config) (*Envoy, *fakeClock, *fakeStream) {
	t.Helper()
	f := startFake(t)
	cfg.Servers = []string{f.addr}
	e, clock := newEnvoy(t, cfg)
	e.Request(req("a"))
	s := f.nextStream(t)
	s.nextReport(t)
	return e, clock, s
}

func req(tenant string) map[string]string { return map[string]string{"x-tenant": tenant} }

func tokenBucketAction(id map[string]string, max, perFill uint32, interval time.Duration, ttl time.Duration) *rlqspb.RateLimitQuotaResponse {
	return action(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: max, TokensPerFill: wrapperspb.UInt32(perFill), FillInterval: durationpb.New(interval),
	}}}, ttl)
}

func blanketAction(id map[string]string, rule typev3.RateLimitStrategy_BlanketRule, ttl time.Duration) *rlqspb.RateLimitQuotaResponse {
	return action(id, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: rule}}, ttl)
}

func action(id map[string]string, s *typev3.RateLimitStrategy, ttl time.Duration) *rlqspb.RateLimitQuotaResponse {
	return &rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{{
		BucketId: &rlqspb.BucketId{Bucket: id},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction_{
			QuotaAssignmentAction: &rlqspb.RateLimitQuotaResponse_BucketAction_QuotaAssignmentAction{
				AssignmentTimeToLive: durationpb.New(ttl), RateLimitStrategy: s,
			},
		},
	}}}
}

// admitted runs n requests of tenant and returns how many were allowed.
func admitted(e *Envoy, tenant string, n int) int {
	a := 0
	for range n {
		if e.Request(req(tenant)).Allowed {
			a++
		}
	}
	return a
}

func TestFirstRequestReportedAtOnce(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	e, clock := newEnvoy(t, Config{Servers: []string{f.addr}})
	if d := e.Request(req("a")); !d.Allowed {
		t.Fatalf("Request(first) = %+v, want allowed (no_assignment_behavior unset: ALLOW_ALL)", d)
	}
	s := f.nextStream(t)
	r := s.nextReport(t)
	if r.GetDomain() != "d" || len(r.GetBucketQuotaUsages()) != 1 {
		t.Fatalf("first report = %v, want domain d and one bucket", r)
	}
	u := r.GetBucketQuotaUsages()[0]
	if u.GetNumRequestsAllowed() != 1 || u.GetNumRequestsDenied() != 0 || u.GetTimeElapsed().AsDuration() != 0 || u.GetBucketId().GetBucket()["tenant"] != "a" {
		t.Fatalf("first usage = %v, want tenant a, 1 allowed, time_elapsed 0", u)
	}
	// A second bucket goes on the same stream, reported at once on its own.
	e.Request(req("b"))
	if r := s.nextReport(t); len(r.GetBucketQuotaUsages()) != 1 || r.GetBucketQuotaUsages()[0].GetBucketId().GetBucket()["tenant"] != "b" {
		t.Fatalf("second bucket's report = %v, want bucket b alone", r)
	}
	// The periodic report has both buckets, counters since the last report,
	// time_elapsed in whole seconds rounded down.
	admitted(e, "a", 4)
	clock.Add(2700 * time.Millisecond)
	e.Report()
	r = s.nextReport(t)
	got := map[string]*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{}
	for _, u := range r.GetBucketQuotaUsages() {
		got[u.GetBucketId().GetBucket()["tenant"]] = u
	}
	if len(got) != 2 || got["a"].GetNumRequestsAllowed() != 4 || got["b"].GetNumRequestsAllowed() != 0 ||
		got["a"].GetTimeElapsed().AsDuration() != 2*time.Second {
		t.Fatalf("periodic report = %v, want a: 4 allowed in 2s, b: 0", r)
	}
	e.Report()
	if r := s.nextReport(t); r.GetBucketQuotaUsages()[0].GetNumRequestsAllowed() != 0 {
		t.Fatalf("report after a report = %v, want counters reset", r)
	}
	select {
	case <-f.streams:
		t.Fatal("a second stream was opened; Envoy keeps one per server and domain")
	default:
	}
	if e.Unmatched() != 0 {
		t.Fatalf("Unmatched() = %d, want 0", e.Unmatched())
	}
	if got := e.Totals(); got != (Counts{Admitted: 6, Unassigned: 6}) {
		t.Fatalf("Totals() = %+v, want 6 admitted, all without an assignment", got)
	}
	if d := e.Request(map[string]string{}); !d.Allowed || d.Bucket != "" || e.Unmatched() != 1 {
		t.Fatalf("Request(no header) = %+v, unmatched %d; want allowed, no bucket, 1 unmatched", d, e.Unmatched())
	}
}

func TestNoAssignmentDenyAll(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	deny := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
	e, _ := newEnvoy(t, Config{Servers: []string{f.addr}, NoAssignment: deny})
	if d := e.Request(req("a")); d.Allowed {
		t.Fatal("Request(first) allowed, want denied under a blanket DENY_ALL no_assignment_behavior")
	}
	if a := admitted(e, "a", 3); a != 0 {
		t.Fatalf("admitted %d before any assignment, want 0", a)
	}
	u := f.nextStream(t).nextReport(t).GetBucketQuotaUsages()[0]
	if u.GetNumRequestsDenied() != 1 || u.GetNumRequestsAllowed() != 0 {
		t.Fatalf("first usage = %v, want 1 denied", u)
	}
	if _, err := New(Config{Domain: "d", Servers: []string{"x"}, BucketID: map[string]Value{"k": {String: "v"}},
		NoAssignment: &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{MaxTokens: 1}}}}); err == nil {
		t.Fatal("New(token_bucket no_assignment_behavior) = nil error, want one")
	}
}

func TestTokenBucketAssignments(t *testing.T) {
	t.Parallel()
	e, clock, s := withBucket(t, Config{})
	rpt := action(tenantA, &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_RequestsPerTimeUnit_{
		RequestsPerTimeUnit: &typev3.RateLimitStrategy_RequestsPerTimeUnit{RequestsPerTimeUnit: 1000, TimeUnit: typev3.RateLimitUnit_SECOND},
	}}, time.Minute)
	// Each step: the clock moves by advance, the server sends resp (if any),
	// then n requests run, of which want are admitted.
	steps := []struct {
		name    string
		advance time.Duration
		resp    *rlqspb.RateLimitQuotaResponse
		n, want int
	}{
		{"a full bucket of 4, 1 token per 2s", 0, tokenBucketAction(tenantA, 4, 1, 2*time.Second, time.Minute), 10, 4},
		{"one fill interval later", 2 * time.Second, nil, 10, 1},
		{"an equal assignment keeps the empty bucket", 0, tokenBucketAction(tenantA, 4, 1, 2*time.Second, time.Minute), 10, 0},
		// Envoy compares fill_interval's nanoseconds only.
		{"an assignment differing in fill_interval seconds keeps the bucket", 0, tokenBucketAction(tenantA, 4, 1, 9*time.Second, time.Minute), 10, 0},
		// 4 s later the old bucket holds 2 of 4 (its rate stayed 1/2s):
		// the new one starts with the same ratio, 5 of 10.
		{"a changed assignment from a half-full bucket", 4 * time.Second, tokenBucketAction(tenantA, 10, 1, time.Minute, time.Minute), 20, 5},
		{"a changed assignment from an empty bucket starts empty", 0, tokenBucketAction(tenantA, 100, 1, time.Minute, time.Minute), 20, 0},
		{"ALLOW_ALL", 0, blanketAction(tenantA, typev3.RateLimitStrategy_ALLOW_ALL, time.Minute), 20, 20},
		{"a token bucket after a blanket rule starts full", 0, tokenBucketAction(tenantA, 7, 1, time.Minute, time.Minute), 20, 7},
		// Not enforced: the previous action (the empty bucket) stays.
		{"requests_per_time_unit", 0, rpt, 5, 0},
		// Envoy divides by the whole seconds, 0: an infinite rate.
		{"a fill interval under 1s", 0, tokenBucketAction(tenantA, 1, 1, 500*time.Millisecond, time.Minute), 50, 50},
	}
	for _, st := range steps {
		clock.Add(st.advance)
		if st.resp != nil {
			s.respond(t, e, st.resp)
		}
		if a := admitted(e, "a", st.n); a != st.want {
			t.Fatalf("%s: admitted %d of %d, want %d", st.name, a, st.n, st.want)
		}
	}
	// Only the bucket's first request was admitted without an assignment.
	if got := e.Totals().Unassigned; got != 1 {
		t.Fatalf("Totals().Unassigned = %d, want 1 (the first request)", got)
	}
	// An action for an unknown bucket is ignored.
	s.respond(t, e, blanketAction(map[string]string{"tenant": "zz"}, typev3.RateLimitStrategy_DENY_ALL, time.Minute))
	if e.HasBucket(map[string]string{"tenant": "zz"}) {
		t.Fatal("an action for an unknown bucket made one")
	}
}

func TestTimeToLive(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	fallback := &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_TokenBucket{TokenBucket: &typev3.TokenBucket{
		MaxTokens: 3, TokensPerFill: wrapperspb.UInt32(1), FillInterval: durationpb.New(time.Hour),
	}}}
	e, clock := newEnvoy(t, Config{Servers: []string{f.addr}, ExpiredFallback: fallback, ExpiredFallbackTimeout: 3500 * time.Millisecond})
	e.Request(req("a"))
	s := f.nextStream(t)
	s.nextReport(t)

	// TTL 2.9 s counts as 2 s.
	s.respond(t, e, blanketAction(tenantA, typev3.RateLimitStrategy_DENY_ALL, 2900*time.Millisecond))
	clock.Add(1999 * time.Millisecond)
	if a := admitted(e, "a", 5); a != 0 {
		t.Fatalf("admitted %d before the TTL, want 0 (DENY_ALL)", a)
	}
	clock.Add(time.Millisecond)
	// Expired: the expired_assignment_behavior fallback (a full bucket of 3)
	// for 3 s (whole seconds of 3.5 s), then no_assignment_behavior (ALLOW_ALL).
	if a := admitted(e, "a", 10); a != 3 {
		t.Fatalf("admitted %d at the TTL, want 3 (fallback token bucket)", a)
	}
	clock.Add(2999 * time.Millisecond)
	if a := admitted(e, "a", 10); a != 0 {
		t.Fatalf("admitted %d before the fallback's timeout, want 0", a)
	}
	clock.Add(time.Millisecond)
	if a := admitted(e, "a", 10); a != 10 {
		t.Fatalf("admitted %d after the fallback's timeout, want 10 (ALLOW_ALL default)", a)
	}
	// All but the DENY_ALL's were admitted without an assignment.
	if got := e.Totals(); got.Unassigned != got.Admitted || got.Admitted != 14 {
		t.Fatalf("Totals() = %+v, want 14 admitted, all unassigned", got)
	}

	// A TTL under 1 s expires at once.
	s.respond(t, e, blanketAction(tenantA, typev3.RateLimitStrategy_DENY_ALL, 900*time.Millisecond))
	if a := admitted(e, "a", 3); a != 3 {
		t.Fatalf("admitted %d under a DENY_ALL with TTL 0.9s, want 3 (expired at once; fallback bucket)", a)
	}
}

func TestTimeToLiveWithoutFallback(t *testing.T) {
	t.Parallel()
	e, clock, s := withBucket(t, Config{})
	s.respond(t, e, tokenBucketAction(tenantA, 2, 1, time.Hour, 5*time.Second))
	admitted(e, "a", 5)
	clock.Add(5 * time.Second)
	if a := admitted(e, "a", 5); a != 5 {
		t.Fatalf("admitted %d after the TTL with no fallback, want 5 (ALLOW_ALL)", a)
	}
	// The token bucket was dropped at expiry: the next one starts full.
	s.respond(t, e, tokenBucketAction(tenantA, 2, 1, time.Hour, 5*time.Second))
	if a := admitted(e, "a", 5); a != 2 {
		t.Fatalf("admitted %d from an assignment after expiry, want 2 (full)", a)
	}
}

func TestAbandon(t *testing.T) {
	t.Parallel()
	e, clock, s := withBucket(t, Config{})
	s.respond(t, e, blanketAction(tenantA, typev3.RateLimitStrategy_DENY_ALL, time.Minute))
	admitted(e, "a", 7) // unreported usage, lost with the bucket
	s.respond(t, e, &rlqspb.RateLimitQuotaResponse{BucketAction: []*rlqspb.RateLimitQuotaResponse_BucketAction{{
		BucketId:     &rlqspb.BucketId{Bucket: tenantA},
		BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
	}}})
	if e.HasBucket(tenantA) {
		t.Fatal("bucket still cached after abandon")
	}
	e.Report()
	if r := s.nextReport(t); len(r.GetBucketQuotaUsages()) != 0 || r.GetDomain() != "d" {
		t.Fatalf("report after abandon = %v, want the domain and no bucket (its usage erased)", r)
	}
	clock.Add(3 * time.Second)
	// The next request is a new bucket's first: allowed (DENY_ALL is gone)
	// and reported at once with time_elapsed 0.
	if !e.Request(req("a")).Allowed {
		t.Fatal("first request after abandon denied, want allowed")
	}
	u := s.nextReport(t).GetBucketQuotaUsages()
	if len(u) != 1 || u[0].GetNumRequestsAllowed() != 1 || u[0].GetTimeElapsed().AsDuration() != 0 {
		t.Fatalf("report after abandon's next request = %v, want 1 allowed, time_elapsed 0", u)
	}
}

func TestBrokenStream(t *testing.T) {
	t.Parallel()
	f1, f2 := startFake(t), startFake(t)
	e, _ := newEnvoy(t, Config{Servers: []string{f1.addr, f2.addr}})
	e.Request(req("a"))
	s1 := f1.nextStream(t)
	s1.nextReport(t)
	s1.respond(t, e, tokenBucketAction(tenantA, 3, 1, time.Hour, time.Minute))
	admitted(e, "a", 1)

	// The server ends the stream: nothing is reopened until the next report.
	close(s1.end)
	deadline := time.Now().Add(5 * time.Second)
	for e.Server() != "" && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if e.Server() != "" {
		t.Fatal("stream still open after the server ended it")
	}
	// The cached assignment stays in force: 2 tokens left.
	if a := admitted(e, "a", 5); a != 2 {
		t.Fatalf("admitted %d with the stream down, want 2 (assignment kept until its TTL)", a)
	}
	// The next report reopens it, to the next server, and carries the usage.
	e.Report()
	s2 := f2.nextStream(t)
	u := s2.nextReport(t).GetBucketQuotaUsages()
	if len(u) != 1 || u[0].GetNumRequestsAllowed() != 3 || u[0].GetNumRequestsDenied() != 3 {
		t.Fatalf("report on the new stream = %v, want 3 allowed, 3 denied", u)
	}
	if got := e.Server(); got != f2.addr {
		t.Fatalf("Server() = %q, want %q", got, f2.addr)
	}

	// Both servers down: the report's usage is dropped, and the next one
	// after a server is back carries only what came after.
	f1.srv.Stop()
	f2.srv.Stop()
	for e.Server() != "" && time.Now().Before(deadline.Add(5*time.Second)) {
		time.Sleep(5 * time.Millisecond)
	}
	admitted(e, "a", 4)
	e.Report()
	if rc := e.ReportCounts(); rc.Dropped != 1 || rc.Opened != 2 || rc.Broken != 2 {
		t.Fatalf("ReportCounts() = %+v, want 1 dropped, 2 opened, 2 broken", rc)
	}
}

func TestTokenBucketModel(t *testing.T) {
	t.Parallel()
	tb := &typev3.TokenBucket{MaxTokens: 10, TokensPerFill: wrapperspb.UInt32(4), FillInterval: durationpb.New(2500 * time.Millisecond)}
	b := newTokenBucket(tb, 100, nil)
	// 4 tokens per 2 s (2.5 s rounds down to 2): 2 tokens a second.
	if b.rate != 2 || b.remaining(100) != 10 {
		t.Fatalf("newTokenBucket = rate %v, remaining %v; want 2, 10", b.rate, b.remaining(100))
	}
	for i := range 10 {
		if !b.take(100) {
			t.Fatalf("take %d of a full bucket of 10 failed", i+1)
		}
	}
	if b.take(100) {
		t.Fatal("take from an empty bucket succeeded")
	}
	if got := b.remaining(101); got != 2 {
		t.Fatalf("remaining after 1s = %v, want 2", got)
	}
	if got := b.remaining(1000); got != 10 {
		t.Fatalf("remaining after long = %v, want 10 (capped)", got)
	}
	// Replacement at 7 of 10 -> 70% of 5 = 3.5, rounded down to 3.
	b2 := newTokenBucket(&typev3.TokenBucket{MaxTokens: 5, TokensPerFill: wrapperspb.UInt32(1), FillInterval: durationpb.New(time.Hour)}, 103.5, b)
	if got := b2.remaining(103.5); got != 3 {
		t.Fatalf("replacement remaining = %v, want 3", got)
	}
	// tokens_per_fill 0: Envoy's minimum rate, one token a year.
	b3 := newTokenBucket(&typev3.TokenBucket{MaxTokens: 1, TokensPerFill: wrapperspb.UInt32(0), FillInterval: durationpb.New(time.Second)}, 0, nil)
	if b3.rate != minFillRate {
		t.Fatalf("rate with 0 tokens per fill = %v, want %v", b3.rate, minFillRate)
	}
}

func TestReplaceFull(t *testing.T) {
	t.Parallel()
	e, _, s := withBucket(t, Config{ReplaceFull: true})
	s.respond(t, e, tokenBucketAction(tenantA, 4, 1, time.Hour, time.Minute))
	admitted(e, "a", 4)
	s.respond(t, e, tokenBucketAction(tenantA, 6, 1, time.Hour, time.Minute))
	if a := admitted(e, "a", 10); a != 6 {
		t.Fatalf("admitted %d after a changed assignment from an empty bucket with ReplaceFull, want 6 (full)", a)
	}
}

// TestBlanketThenTokenBucket shows how a server can make today's Envoy start a
// changed token bucket full: in one response, a blanket rule (which drops the
// running bucket) and then the token bucket. Envoy applies a response's
// actions in order and publishes the result once, so no request sees the
// blanket rule.
func TestBlanketThenTokenBucket(t *testing.T) {
	t.Parallel()
	e, _, s := withBucket(t, Config{})
	s.respond(t, e, tokenBucketAction(tenantA, 4, 1, time.Hour, time.Minute))
	admitted(e, "a", 4)
	r := blanketAction(tenantA, typev3.RateLimitStrategy_DENY_ALL, time.Minute)
	r.BucketAction = append(r.BucketAction, tokenBucketAction(tenantA, 6, 1, time.Hour, time.Minute).BucketAction...)
	s.respond(t, e, r)
	if a := admitted(e, "a", 10); a != 6 {
		t.Fatalf("admitted %d after DENY_ALL then a token bucket of 6 in one response, want 6 (full)", a)
	}
}

func TestClients(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	cc, err := grpc.NewClient(f.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	client := rlqspb.NewRateLimitQuotaServiceClient(cc)
	if _, err := New(Config{Domain: "d", BucketID: map[string]Value{"t": {String: "x"}}, Servers: []string{f.addr}, Clients: []rlqspb.RateLimitQuotaServiceClient{client}}); err == nil {
		t.Fatal("New(Servers and Clients) = nil error, want one naming both")
	}
	e, _ := newEnvoy(t, Config{Clients: []rlqspb.RateLimitQuotaServiceClient{client}})
	e.Request(req("a"))
	s := f.nextStream(t)
	if u := s.nextReport(t).GetBucketQuotaUsages(); len(u) != 1 || u[0].GetNumRequestsAllowed() != 1 {
		t.Fatalf("first report on a client's stream = %v, want 1 allowed", u)
	}
	if got := e.Server(); got != "client 0" {
		t.Fatalf("Server() = %q, want %q", got, "client 0")
	}
}
