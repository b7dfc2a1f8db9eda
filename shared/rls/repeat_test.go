package rls_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// TestRepeatedKeyPolicyDomain sends descriptors whose key repeats to a domain of a
// tollgate policy: the first value of the key is the attribute of that name, and a
// later one is the attribute descriptor.N (N its place from 0), which a rule can
// match.
func TestRepeatedKeyPolicyDomain(t *testing.T) {
	t.Parallel()
	eng := policyEngine(t, "redis://"+redistest.StartServer(t).Addr, false, `domain: rl
rules:
  - {name: tenant-a, match: {tenant: a}, limits: [{algorithm: fixed_window, rate: 2/min}]}
  - {name: second-b, match: {"descriptor.1": b}, limits: [{algorithm: fixed_window, rate: 1/min}]}
`)
	c := serve(t, rls.New(eng, nil))
	for _, step := range []struct {
		what      string
		kv        []string
		code      rlsv3.RateLimitResponse_Code
		limit     uint32 // 0: no limit
		remaining uint32
	}{
		{"a then b: both rules, the tighter states", []string{"tenant", "a", "tenant", "b"}, rlsv3.RateLimitResponse_OK, 1, 0},
		{"a then b again: second-b over, nothing charged", []string{"tenant", "a", "tenant", "b"}, rlsv3.RateLimitResponse_OVER_LIMIT, 1, 0},
		{"b then a: neither rule matches", []string{"tenant", "b", "tenant", "a"}, rlsv3.RateLimitResponse_OK, 0, 0},
		{"a alone: tenant-a's second unit", []string{"tenant", "a"}, rlsv3.RateLimitResponse_OK, 2, 0},
		{"a alone again: tenant-a over", []string{"tenant", "a"}, rlsv3.RateLimitResponse_OVER_LIMIT, 2, 0},
	} {
		resp, err := c.ShouldRateLimit(context.Background(), request("rl", descriptor(step.kv...)))
		if err != nil || len(resp.Statuses) != 1 {
			t.Fatalf("%s: %v, %v; want one status", step.what, resp, err)
		}
		st := resp.Statuses[0]
		if st.Code != step.code || st.CurrentLimit.GetRequestsPerUnit() != step.limit || st.LimitRemaining != step.remaining {
			t.Errorf("%s: %v, limit %d, remaining %d; want %v, limit %d, remaining %d",
				step.what, st.Code, st.CurrentLimit.GetRequestsPerUnit(), st.LimitRemaining, step.code, step.limit, step.remaining)
		}
	}
}
