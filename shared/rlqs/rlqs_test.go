package rlqs_test

import (
	"context"
	"net"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// fleetPolicy is a policy of domain fleet with one rule, per-tenant, that shares
// a fixed_window limit of rate over RLQS with the rlqs block given, and the failure
// block given.
func fleetPolicy(failure, rlqs, rate string) string {
	return "domain: fleet\nfailure: " + failure + "\nrules:\n  - name: per-tenant\n    match: {tenant: \"*\"}\n    rlqs: " + rlqs +
		"\n    limits: [{algorithm: fixed_window, rate: " + rate + "}]\n"
}

// testPolicy shares 6000 per 10s per tenant.
var testPolicy = fleetPolicy("{timeout: 2s}", "{}", "6000/10s")

// backend is a real Redis, standalone or a 3-master cluster.
type backend struct {
	name    string
	cluster bool
	start   func(t *testing.T) string
}

var backends = []backend{
	{"standalone", false, func(t *testing.T) string { return "redis://" + redistest.StartServer(t).Addr }},
	{"cluster", true, func(t *testing.T) string { return redistest.StartCluster(t).URL() }},
}

// newEngine returns an engine of the policy doc on the Redis at url.
func newEngine(t testing.TB, url string, cluster bool, doc string) *engine.Engine {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	st, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// serve runs a Server of eng behind a gRPC server on loopback (with Run) and
// returns a client of it.
func serve(t testing.TB, eng *engine.Engine, limits rlqs.Limits) (rlqspb.RateLimitQuotaServiceClient, *rlqs.Server) {
	t.Helper()
	return serveConfig(t, rlqs.Config{Engine: eng, Limits: limits})
}

// serveConfig is serve of a Server of cfg.
func serveConfig(t testing.TB, cfg rlqs.Config) (rlqspb.RateLimitQuotaServiceClient, *rlqs.Server) {
	t.Helper()
	srv, err := rlqs.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go srv.Run(ctx)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rlqs.ServerOptions()...)
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlqspb.NewRateLimitQuotaServiceClient(conn), srv
}

// usage is one bucket's usage in a report.
func usage(allowed, denied uint64, elapsed time.Duration, kv ...string) *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage {
	id := &rlqspb.BucketId{Bucket: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		id.Bucket[kv[i]] = kv[i+1]
	}
	return &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		BucketId: id, TimeElapsed: durationpb.New(elapsed), NumRequestsAllowed: allowed, NumRequestsDenied: denied,
	}
}

// grantOf returns the units an action grants: max_tokens of a token bucket, 0 for
// a blanket deny, -1 for anything else.
func grantOf(a *rlqspb.RateLimitQuotaResponse_BucketAction) int64 {
	s := a.GetQuotaAssignmentAction().GetRateLimitStrategy()
	switch {
	case s.GetTokenBucket() != nil:
		return int64(s.GetTokenBucket().GetMaxTokens())
	case s != nil && s.GetBlanketRule().String() == "DENY_ALL":
		return 0
	}
	return -1
}

// remaining returns what the per-tenant limit of tenant has left in the store now.
func remaining(t testing.TB, eng *engine.Engine, tenant string) int64 {
	t.Helper()
	p, err := eng.Plan(engine.Request{Domain: "fleet", Attributes: map[string]string{"tenant": tenant}})
	if err != nil {
		t.Fatal(err)
	}
	v, err := eng.Peek(context.Background(), p)
	if err != nil {
		t.Fatal(err)
	}
	return v.Limits[0].Remaining
}

// TestFirstReportGetsGrant sends Envoy's first report of a bucket (time_elapsed 0,
// which the proto's own rules would refuse) and checks the answer: a token bucket
// that grants units the store has charged, with a time to live of whole seconds
// within the window.
func TestFirstReportGetsGrant(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			eng := newEngine(t, b.start(t), b.cluster, testPolicy)
			c, _ := serve(t, eng, rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			st, err := c.StreamRateLimitQuotas(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{usage(1, 0, 0, "tenant", "a")}}); err != nil {
				t.Fatal(err)
			}
			resp, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			// A fresh grant comes after a DENY_ALL blanket rule for its bucket, so that
			// Envoy starts its token bucket full.
			if len(resp.BucketAction) != 2 {
				t.Fatalf("Recv() = %d actions, want 2 (a blanket rule, then the grant)", len(resp.BucketAction))
			}
			if r := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy(); r.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL || r.GetTokenBucket() != nil ||
				!proto.Equal(resp.BucketAction[0].GetBucketId(), resp.BucketAction[1].GetBucketId()) {
				t.Fatalf("first action = %v, want DENY_ALL for the grant's bucket", resp.BucketAction[0])
			}
			a := resp.BucketAction[1]
			g := grantOf(a)
			ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()
			t.Logf("grant %d, ttl %s: %v", g, ttl, a)
			if g < 1 || g > 6000 {
				t.Errorf("grant = %d, want 1 to 6000", g)
			}
			if ttl < time.Second && g > 0 || ttl > 10*time.Second || ttl%time.Second != 0 {
				t.Errorf("ttl = %s, want whole seconds within the 10s window", ttl)
			}
			// The grant and the first request charged; or, when the report came at a
			// window's last second, the first request charged to that window and the
			// grant pushed at the next one's start; or a window after the grant's.
			if got := remaining(t, eng, "a"); got != 6000-g-1 && got != 6000-g && got != 6000 {
				t.Errorf("remaining = %d, want %d (the grant and the first request charged), %d (the grant alone, pushed at a window's start) or 6000 (a later window)", got, 6000-g-1, 6000-g)
			}
		})
	}
}
