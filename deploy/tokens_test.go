package deploy_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
)

// TestTokensExample checks deploy/examples/tokens, tokens per minute per tenant: the
// Envoy configuration decoded strictly (protojson, unknown fields refused) into a v3
// Bootstrap and validated with every typed_config; its route asks twice, before the
// request (the tenant alone, no hits_addend, not on stream done) and when the stream
// is done (apply_on_stream_done, hits_addend from dynamic metadata, and the
// (phase, response) entry the settling rule matches); the filter asks the tollgate_rls
// cluster over HTTP/2 for the domain of the policy and of the ERL configuration. (The policy and the ERL configuration are
// served on real Redis by shared/rls's settlement tests.)
func TestTokensExample(t *testing.T) {
	t.Parallel()
	const dir = "examples/tokens/"
	bs, hcm := bootstrapFile(t, dir+"envoy.yaml")
	var rl *ratelimitv3.RateLimit
	var names []string
	for _, f := range hcm.GetHttpFilters() {
		names = append(names, f.GetName())
		if f.GetName() == "envoy.filters.http.ratelimit" {
			rl = &ratelimitv3.RateLimit{}
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
		}
	}
	if !slices.Equal(names, []string{"envoy.filters.http.ratelimit", "envoy.filters.http.router"}) || rl == nil {
		t.Fatalf("envoy.yaml: HTTP filters %v, want the rate limit filter before the router", names)
	}
	if c := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName(); c != "tollgate_rls" {
		t.Errorf("the rate limit filter asks cluster %q, want tollgate_rls", c)
	}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() == "tollgate_rls" && len(c.GetTypedExtensionProtocolOptions()) == 0 {
			t.Errorf("cluster tollgate_rls has no HTTP/2 protocol options; gRPC needs them")
		}
	}
	domain := "domain: " + rl.GetDomain() + "\n"
	for _, f := range []string{"policy.yaml", "ratelimit-config.yaml"} {
		if !bytes.Contains(readFile(t, dir+f), []byte(domain)) {
			t.Errorf("%s does not decide the filter's domain %q", f, rl.GetDomain())
		}
	}

	routes := hcm.GetRouteConfig().GetVirtualHosts()[0].GetRoutes()
	limits := routes[0].GetRoute().GetRateLimits()
	if len(limits) != 2 {
		t.Fatalf("the route has %d rate_limits, want 2: the request phase's and the response phase's", len(limits))
	}
	check, settle := limits[0], limits[1]
	if check.GetApplyOnStreamDone() || check.GetHitsAddend() != nil {
		t.Errorf("the request phase's rate limit: apply_on_stream_done %v, hits_addend %v; want neither (a check at 1)", check.GetApplyOnStreamDone(), check.GetHitsAddend())
	}
	if !settle.GetApplyOnStreamDone() || !strings.HasPrefix(settle.GetHitsAddend().GetFormat(), "%DYNAMIC_METADATA(") {
		t.Errorf("the response phase's rate limit: apply_on_stream_done %v, hits_addend %v; want true and the tokens from dynamic metadata", settle.GetApplyOnStreamDone(), settle.GetHitsAddend())
	}
	entries := func(r *routev3.RateLimit) []string {
		var out []string
		for _, a := range r.GetActions() {
			switch {
			case a.GetRequestHeaders() != nil:
				out = append(out, a.GetRequestHeaders().GetDescriptorKey()+"=<"+a.GetRequestHeaders().GetHeaderName()+">")
			case a.GetGenericKey() != nil:
				out = append(out, a.GetGenericKey().GetDescriptorKey()+"="+a.GetGenericKey().GetDescriptorValue())
			default:
				out = append(out, fmt.Sprintf("%v", a))
			}
		}
		return out
	}
	if got, want := entries(check), []string{"tenant=<x-tenant-id>"}; !slices.Equal(got, want) {
		t.Errorf("the request phase's descriptor %v, want %v", got, want)
	}
	if got, want := entries(settle), []string{"tenant=<x-tenant-id>", "phase=response"}; !slices.Equal(got, want) {
		t.Errorf("the response phase's descriptor %v, want %v: the entry only the settling rule matches", got, want)
	}
	for _, f := range []string{"policy.yaml", "ratelimit-config.yaml"} {
		if b := readFile(t, dir+f); !bytes.Contains(b, []byte("settle: true")) || !bytes.Contains(b, []byte("response")) {
			t.Errorf("%s has no settling rule for phase response", f)
		}
	}

}
