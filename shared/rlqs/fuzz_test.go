package rlqs_test

import (
	"context"
	"io"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// fakeStream is a stream that receives the given reports, then ends, and keeps
// what the service sends.
type fakeStream struct {
	grpc.ServerStream
	in  []*rlqspb.RateLimitQuotaUsageReports
	out []*rlqspb.RateLimitQuotaResponse
}

func (f *fakeStream) Context() context.Context { return context.Background() }

func (f *fakeStream) Recv() (*rlqspb.RateLimitQuotaUsageReports, error) {
	if len(f.in) == 0 {
		return nil, io.EOF
	}
	r := f.in[0]
	f.in = f.in[1:]
	return r, nil
}

func (f *fakeStream) Send(r *rlqspb.RateLimitQuotaResponse) error {
	f.out = append(f.out, r)
	return nil
}

// FuzzReport decodes any bytes as a report (the bucket ids Envoy builds from
// requests become attributes) and serves it twice on one stream, on an in-process
// engine: never a panic; the stream ends cleanly (a refused bucket id drops that
// bucket's usage, never the stream); every action names a bucket of the report, and
// no grant exceeds the limit. The seed corpus is in testdata/fuzz/FuzzReport.
func FuzzReport(f *testing.F) {
	seed, _ := proto.Marshal(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
		usage(1, 0, 0, "tenant", "a"), usage(3, 4, 5*time.Second, "tenant", "b", "path", "/x"), usage(0, 0, 0, "other", "c"),
	}})
	f.Add(seed)
	f.Add([]byte{})
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r rlqspb.RateLimitQuotaUsageReports
		if proto.Unmarshal(data, &r) != nil {
			return
		}
		r.Domain = "fleet"
		eng, err := engine.New(engine.Config{Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := rlqs.New(rlqs.Config{Engine: eng})
		if err != nil {
			t.Fatal(err)
		}
		st := &fakeStream{in: []*rlqspb.RateLimitQuotaUsageReports{&r, &r}}
		if err := srv.StreamRateLimitQuotas(st); err != nil {
			t.Fatalf("StreamRateLimitQuotas() = %v, want nil", err)
		}
		ids := map[string]bool{}
		for _, u := range r.GetBucketQuotaUsages() {
			b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(u.GetBucketId())
			ids[string(b)] = true
		}
		for _, resp := range st.out {
			for _, a := range resp.GetBucketAction() {
				b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(a.GetBucketId())
				if !ids[string(b)] {
					t.Fatalf("action for bucket %v, which the report does not have", a.GetBucketId())
				}
				if g := grantOf(a); g > 6000 {
					t.Fatalf("grant %d, over the limit of 6000", g)
				}
			}
		}
	})
}
