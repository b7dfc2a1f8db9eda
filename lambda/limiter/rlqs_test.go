package main

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// rlqsPolicy shares a tenant's limit over RLQS.
const rlqsPolicy = `domain: fleet
rules:
  - name: per-tenant
    match: {tenant: "*"}
    rlqs: {}
    limits: [{algorithm: fixed_window, rate: 6000/10s}]
`

// firstReport is Envoy's first report of a tenant's bucket: one request allowed,
// time_elapsed 0.
func firstReport(tenant string) *rlqspb.RateLimitQuotaUsageReports {
	return &rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId:           &rlqspb.BucketId{Bucket: map[string]string{"tenant": tenant}},
		TimeElapsed:        durationpb.New(0),
		NumRequestsAllowed: 1,
	}}}
}

// TestRLQSOnGRPCListener runs the limiter's gRPC listener on a policy with an rlqs
// rule and a real Redis: Envoy's Rate Limit Quota Service answers a bucket's first
// report with a token bucket grant, beside the RateLimitService.
func TestRLQSOnGRPCListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(pol, []byte(rlqsPolicy), 0o644); err != nil {
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
	if err := st.Send(firstReport("acme")); err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// a fresh grant comes after a DENY_ALL blanket rule for its bucket
	if len(resp.BucketAction) != 2 || resp.BucketAction[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		t.Fatalf("Recv() = %v, want a DENY_ALL blanket rule, then a grant", resp)
	}
	tb := resp.BucketAction[1].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
	if tb == nil || tb.GetMaxTokens() < 1 || tb.GetMaxTokens() > 6000 {
		t.Errorf("Recv() = %v, want a token bucket of 1 to 6000 tokens", resp)
	}
}

// TestRLQSShutdown stops the limiter while an Envoy's quota stream is open: the
// stream ends with UNAVAILABLE (Envoy reports to another instance at its next
// tick) and the limiter returns, where a graceful stop would wait for the stream
// forever.
func TestRLQSShutdown(t *testing.T) {
	t.Parallel()
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte(rlqsPolicy), 0o644); err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartServer(t)
	addr, gaddr := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, env(map[string]string{
			"TOLLGATE_POLICY": pol, "REDIS_URL": "redis://" + srv.Addr, "TOLLGATE_LISTEN": addr, "TOLLGATE_GRPC_LISTEN": gaddr,
		}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	waitReady(t, "http://"+addr)
	conn, err := grpc.NewClient(gaddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
	defer scancel()
	st, err := rlqspb.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(firstReport("acme")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("run() = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("run() has not returned 30s after its context ended: the stop waits for the quota stream")
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Errorf("the stream after the stop: Recv() = %v, want UNAVAILABLE", err)
	}
}
