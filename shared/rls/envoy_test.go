package rls_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	exprv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/rate_limit_descriptors/expr/v3"
	upstreamsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestEnvoyRateLimitConfig checks scripts/envoy/envoy-ratelimit.yaml the way Envoy reads
// it (YAML to JSON, protojson into a v3 Bootstrap, protobuf validation of it and of each
// typed_config), that the rate limit filter runs before the router and asks the
// tollgate_rls cluster over HTTP/2 for the shipped policy's domain, and that every
// descriptor key its actions produce is an attribute of that policy, the path
// without its query.
func TestEnvoyRateLimitConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "scripts", "envoy", "envoy-ratelimit.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatal(err)
	}
	js, _ := json.Marshal(doc)
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("%s: not a v3 Bootstrap: %v", path, err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	unpack := func(a *anypb.Any, m proto.Message) {
		t.Helper()
		if err := a.UnmarshalTo(m); err != nil {
			t.Fatal(err)
		}
		if err := m.(interface{ ValidateAll() error }).ValidateAll(); err != nil {
			t.Fatal(err)
		}
	}
	var hcm hcmv3.HttpConnectionManager
	unpack(bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[0].GetName() != "envoy.filters.http.ratelimit" || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http_filters = %v, want the rate limit filter, then the router", filters)
	}
	unpack(filters[1].GetTypedConfig(), &routerv3.Router{})
	var rl ratelimitv3.RateLimit
	unpack(filters[0].GetTypedConfig(), &rl)
	p, err := policy.Load(filepath.Join("..", "..", "lambda", "policy.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if rl.GetDomain() != p.Domain {
		t.Errorf("domain = %q, want the shipped policy's %q", rl.GetDomain(), p.Domain)
	}
	cluster := rl.GetRateLimitService().GetGrpcService().GetEnvoyGrpc().GetClusterName()
	var found bool
	for _, c := range bs.GetStaticResources().GetClusters() {
		if c.GetName() != cluster {
			continue
		}
		found = true
		var po upstreamsv3.HttpProtocolOptions
		unpack(c.GetTypedExtensionProtocolOptions()["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"], &po)
		if po.GetExplicitHttpConfig().GetHttp2ProtocolOptions() == nil {
			t.Errorf("cluster %s does not speak HTTP/2, which gRPC needs", cluster)
		}
	}
	if !found {
		t.Fatalf("rate_limit_service names cluster %q, which is not defined", cluster)
	}
	attrs := p.Attributes()
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			for _, lim := range r.GetRoute().GetRateLimits() {
				for _, a := range lim.GetActions() {
					key := a.GetRequestHeaders().GetDescriptorKey()
					if a.GetRemoteAddress() != nil {
						key = "remote_address"
					}
					if a.GetRequestHeaders().GetHeaderName() == ":path" {
						t.Errorf("a rate_limits action reads :path, which carries the query: /login?x would miss the policy's /login")
					}
					if ext := a.GetExtension(); ext != nil {
						var d exprv3.Descriptor
						unpack(ext.GetTypedConfig(), &d)
						key = d.GetDescriptorKey()
						if key == "path" && d.GetText() != "request.url_path" {
							t.Errorf("the path descriptor is %q, want request.url_path (the path without its query)", d.GetText())
						}
					}
					if !slices.Contains(attrs, key) {
						t.Errorf("a rate_limits action produces descriptor key %q, which the policy does not match on (%v)", key, attrs)
					}
				}
			}
		}
	}
}
