package deploy_test

import (
	"bytes"
	"slices"
	"testing"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// TestRLQSExample checks deploy/examples/rlqs, one quota per tenant shared through
// tollgate's Rate Limit Quota Service: the Envoy configuration decoded strictly
// (protojson, unknown fields refused) into a v3 Bootstrap and validated with every
// typed_config, the rate limit quota filter's included, down to each bucket's
// settings and the inputs of its bucket id; the filter asks the tollgate_rlqs
// cluster over HTTP/2 for the policy's domain, builds the tenant bucket from the
// x-tenant-id header, and denies (429) a bucket without a grant in force, so that
// the fleet admits only what tollgate granted. (The policy is served on real Redis by
// shared/rlqs's tests, which parse it.)
func TestRLQSExample(t *testing.T) {
	t.Parallel()
	const dir = "examples/rlqs/"
	bs, hcm := bootstrapFile(t, dir+"envoy.yaml")
	var q *rlqsv3.RateLimitQuotaFilterConfig
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		if f.GetName() == "envoy.filters.http.rate_limit_quota" {
			q = &rlqsv3.RateLimitQuotaFilterConfig{}
			if err := f.GetTypedConfig().UnmarshalTo(q); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(names, []string{"envoy.filters.http.rate_limit_quota", "envoy.filters.http.router"}) || q == nil {
		t.Fatalf("envoy.yaml: HTTP filters %v, want the rate limit quota filter before the router", names)
	}
	if c := q.GetRlqsServer().GetEnvoyGrpc().GetClusterName(); c != "tollgate_rlqs" {
		t.Errorf("the filter asks cluster %q, want tollgate_rlqs", c)
	}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == "tollgate_rlqs" && len(c.GetTypedExtensionProtocolOptions()) == 0 {
			t.Errorf("cluster tollgate_rlqs has no HTTP/2 protocol options; gRPC needs them")
		}
	}
	if !bytes.Contains(readFile(t, dir+"policy.yaml"), []byte("domain: "+q.GetDomain()+"\n")) {
		t.Errorf("policy.yaml does not decide the filter's domain %q", q.GetDomain())
	}

	// Every bucket's settings, the matched and the catch-all.
	m := q.GetBucketMatchers()
	var actions []*anypb.Any
	for _, mm := range m.GetMatcherList().GetMatchers() {
		in := mm.GetPredicate().GetSinglePredicate().GetInput().GetTypedConfig()
		var h matcherv3.HttpRequestHeaderMatchInput
		if err := in.UnmarshalTo(&h); err != nil || h.ValidateAll() != nil || h.GetHeaderName() != "x-tenant-id" {
			t.Errorf("a matcher's input = %v (%v), want the x-tenant-id header", in, err)
		}
		actions = append(actions, mm.GetOnMatch().GetAction().GetTypedConfig())
	}
	actions = append(actions, m.GetOnNoMatch().GetAction().GetTypedConfig())
	if len(actions) != 2 {
		t.Fatalf("bucket_matchers has %d actions, want the tenant's and the catch-all", len(actions))
	}
	for i, a := range actions {
		var bs rlqsv3.RateLimitQuotaBucketSettings
		if err := a.UnmarshalTo(&bs); err != nil {
			t.Fatalf("bucket settings %d: %v", i, err)
		}
		if err := bs.ValidateAll(); err != nil {
			t.Fatalf("bucket settings %d: %v", i, err)
		}
		ids := bs.GetBucketIdBuilder().GetBucketIdBuilder()
		tenant, ok := ids["tenant"]
		if !ok {
			t.Errorf("bucket settings %d: no tenant entry in the bucket id, which the policy's rule matches", i)
		}
		if cv := tenant.GetCustomValue(); cv != nil {
			var h matcherv3.HttpRequestHeaderMatchInput
			if err := cv.GetTypedConfig().UnmarshalTo(&h); err != nil || h.ValidateAll() != nil || h.GetHeaderName() != "x-tenant-id" {
				t.Errorf("bucket settings %d: tenant from %v (%v), want the x-tenant-id header", i, cv, err)
			}
		}
		if d := bs.GetReportingInterval().AsDuration(); d.Seconds() != 5 {
			t.Errorf("bucket settings %d: reporting_interval %s, want 5s (what Envoy reports at, whatever it says)", i, d)
		}
		if c := bs.GetDenyResponseSettings().GetHttpStatus().GetCode(); c != typev3.StatusCode_TooManyRequests {
			t.Errorf("bucket settings %d: deny status %v, want 429", i, c)
		}
		deny := typev3.RateLimitStrategy_DENY_ALL
		if r := bs.GetNoAssignmentBehavior().GetFallbackRateLimit(); r.GetBlanketRule() != deny || r.GetTokenBucket() != nil {
			t.Errorf("bucket settings %d: no_assignment_behavior %v, want a blanket DENY_ALL", i, r)
		}
		if r := bs.GetExpiredAssignmentBehavior().GetFallbackRateLimit(); r.GetBlanketRule() != deny || r.GetTokenBucket() != nil {
			t.Errorf("bucket settings %d: expired_assignment_behavior %v, want a blanket DENY_ALL", i, r)
		}
	}
}
