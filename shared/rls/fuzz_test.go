package rls_test

import (
	"context"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// FuzzShouldRateLimit decodes any bytes as a RateLimitRequest and decides it on an
// in-process engine, on envoyproxy/ratelimit's test configurations, and on a tokens
// limit with a settling rule (a policy's and an ERL configuration's): never a
// panic, and either an answer with one status per descriptor, each as ERL states
// one (0 remaining when over, no limit when unlimited), or INVALID_ARGUMENT.
func FuzzShouldRateLimit(f *testing.F) {
	seed, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{descriptor("key1", "foo"), descriptor("remote_address", "192.0.2.1", "key1", "x")}})
	f.Add(seed)
	f.Add([]byte{})
	withLimit := descriptor("key1", "foo")
	withLimit.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(3)}
	seed, _ = proto.Marshal(&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit, descriptor("key1", "bar")}})
	f.Add(seed)
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		f.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		f.Fatal(err)
	}
	for _, d := range [][]string{{"files", "top/a", "files", "nested/b"}, {"key6", "x"}, {"wild", "foo1"}} {
		seed, _ = proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test-domain", HitsAddend: 400, Descriptors: []*rlv3.RateLimitDescriptor{descriptor(d...)}})
		f.Add(seed)
	}
	// Settlements: the response phase's descriptor alone, with a check beside it
	// (refused), and a request's 0.
	for _, hits := range []uint32{0, 300} {
		seed, _ = proto.Marshal(tokens("t1", true, hits))
		f.Add(seed)
	}
	mixed := tokens("t1", false, 5)
	mixed.Descriptors = append(mixed.Descriptors, tokens("t1", true, 5).Descriptors...)
	seed, _ = proto.Marshal(mixed)
	f.Add(seed)
	srv := rls.New(eng, nil)
	var erlServers []*rls.Server
	for _, name := range []string{"basic_config.yaml", "share_threshold.yaml", "wildcard.yaml"} {
		s, err := loadERL(erlFiles(f, name), false, nil)
		if err != nil {
			f.Fatal(err)
		}
		erlServers = append(erlServers, s)
	}
	// The tokens limit in process, as a tollgate policy and an ERL configuration.
	erlServers = append(erlServers, tokensServer(f, "policy", nil, engine.Hooks{}), tokensServer(f, "erl", nil, engine.Hooks{}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		for _, srv := range append([]*rls.Server{srv}, erlServers...) {
			resp, err := srv.ShouldRateLimit(context.Background(), &req)
			if err != nil {
				if status.Code(err) != codes.InvalidArgument {
					t.Fatalf("ShouldRateLimit = %v, want an answer or INVALID_ARGUMENT", err)
				}
				continue
			}
			if len(resp.Statuses) != len(req.Descriptors) {
				t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
			}
			for i, st := range resp.Statuses {
				if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && st.LimitRemaining != 0 || st.CurrentLimit == nil && st.LimitRemaining != 0 && st.LimitRemaining != 1<<32-1 {
					t.Fatalf("status %d = %v: over with some remaining, or remaining without a limit", i, st)
				}
			}
		}
	})
}
