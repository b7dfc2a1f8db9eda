package rls_test

import (
	"context"
	"fmt"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// TestOverrideIgnoresLeases sends descriptors that carry their own limit (Envoy's
// dynamic override) under a policy whose only rule is served from leases, over gRPC
// on a real Redis: the descriptor's own limit is charged exactly once per request,
// never by a reservation of the policy's lease (which charged it 10 at once), and the
// leased rule keeps serving requests without an override.
func TestOverrideIgnoresLeases(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	eng := policyEngine(t, "redis://"+srv.Addr, false, `domain: rl
failure: {timeout: 2s}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits: [{algorithm: fixed_window, rate: 1000/min, lease: {units: 10, for: 1s}}]
`)
	c := serve(t, rls.New(eng, nil))
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()

	own := descriptor("api_key", "k")
	own.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 50, Unit: typev3.RateLimitUnit_MINUTE}
	for i := 1; i <= 3; i++ {
		resp, err := c.ShouldRateLimit(ctx, request("rl", own))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].GetLimitRemaining() != uint32(50-i) {
			t.Fatalf("request %d with its own limit: %v remaining %d, want OK remaining %d", i, resp.OverallCode, resp.Statuses[0].GetLimitRemaining(), 50-i)
		}
		keys, err := rdb.Keys(ctx, "*"+rls.OverrideRule+"*").Result()
		if err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 {
			t.Fatalf("after request %d: %d keys of the descriptor's own limit (%v), want 1", i, len(keys), keys)
		}
		if got := rdb.Get(ctx, keys[0]).Val(); got != fmt.Sprint(i) {
			t.Errorf("after request %d: %s holds %s, want %d (one charge per request)", i, keys[0], got, i)
		}
	}
	// The policy's leased limit still serves a descriptor without an override, from a
	// reservation of 10.
	resp, err := c.ShouldRateLimit(ctx, request("rl", descriptor("api_key", "k")))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("request without an override: %v, want OK", resp.OverallCode)
	}
	keys, err := rdb.Keys(ctx, "*per-key*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 1 || rdb.Get(ctx, keys[0]).Val() != "10" {
		t.Errorf("the leased limit's keys = %v; want one holding a reservation of 10", keys)
	}
}
