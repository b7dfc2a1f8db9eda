package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestRLQSOnGRPCListener runs the limiter's gRPC listener on a policy with an rlqs
// rule and a real Redis: Envoy's Rate Limit Quota Service answers a bucket's first
// report with a token bucket grant, beside the RateLimitService.
func TestRLQSOnGRPCListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(`domain: fleet
rules:
  - name: per-tenant
    match: {tenant: "*"}
    rlqs: {}
    limits: [{algorithm: fixed_window, rate: 6000/10s}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	url := "redis://" + redistest.StartServer(t).Addr
	c, err := loadConfig(env(nil), []string{"--policy", pol, "--redis", url, "--grpc-listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, c)
	addr := serveGRPC(t, c, s)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"tenant": "acme"}},
		TimeElapsed:        durationpb.New(0),
		NumRequestsAllowed: 1,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.BucketAction) != 1 {
		t.Fatalf("Recv() = %v, want one bucket action", resp)
	}
	tb := resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() < 1 || tb.GetMaxTokens() > 6000 {
		t.Errorf("Recv() = %v, want a token bucket of 1 to 6000 tokens", resp)
	}
}
