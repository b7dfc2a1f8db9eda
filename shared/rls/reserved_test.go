package rls_test

import (
	"context"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestERLKeyNamedLikeTollgates serves an ERL configuration whose keys are named like
// the attributes tollgate sets itself (descriptor.keys, descriptor.1): they load,
// and decide as any other key over gRPC on a real Redis, nested and with a
// descriptor that repeats a key.
func TestERLKeyNamedLikeTollgates(t *testing.T) {
	t.Parallel()
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, []byte(`domain: reserved
descriptors:
  - key: descriptor.keys
    value: x
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: descriptor.1
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: k
    descriptors:
      - key: descriptor.keys
        rate_limit: {unit: minute, requests_per_unit: 3}
`))
	ctx := context.Background()
	for _, tc := range []struct {
		what string
		kv   []string
		want int // admitted of 5; -1: no limit
	}{
		{"descriptor.keys=x", []string{"descriptor.keys", "x"}, 2},
		{"descriptor.keys=y, no rule", []string{"descriptor.keys", "y"}, -1},
		{"descriptor.keys=x, descriptor.1=v (nested)", []string{"descriptor.keys", "x", "descriptor.1", "v"}, 1},
		{"k=a, descriptor.keys=z", []string{"k", "a", "descriptor.keys", "z"}, 3},
		{"descriptor.keys=x, descriptor.keys=x (a repeat, no nested rule)", []string{"descriptor.keys", "x", "descriptor.keys", "x"}, -1},
	} {
		admitted := 0
		for range 5 {
			resp, err := c.ShouldRateLimit(ctx, request("reserved", descriptor(tc.kv...)))
			if err != nil {
				t.Fatalf("%s: %v", tc.what, err)
			}
			if tc.want < 0 && (resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil) {
				t.Fatalf("%s: %v; want OK with no limit", tc.what, resp)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if tc.want >= 0 && admitted != tc.want {
			t.Errorf("%s: %d of 5 admitted, want %d", tc.what, admitted, tc.want)
		}
	}
}
