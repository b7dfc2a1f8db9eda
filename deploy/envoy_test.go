package deploy_test

import (
	"fmt"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
	"sigs.k8s.io/yaml"
)

// The Envoy and Istio types the examples decode into. Importing the rate limit
// filter's and the upstream HTTP options' packages registers their types, so that
// protojson resolves the "@type" of a typed_config.

func newEnvoyFilter() *networkingv1alpha3.EnvoyFilter { return &networkingv1alpha3.EnvoyFilter{} }
func newHTTPFilter() *hcmv3.HttpFilter                { return &hcmv3.HttpFilter{} }
func newCluster() *clusterv3.Cluster                  { return &clusterv3.Cluster{} }
func newVirtualHost() *routev3.VirtualHost            { return &routev3.VirtualHost{} }

// configPatch is one patch of an EnvoyFilter: what it applies to and its value.
type configPatch struct {
	applyTo string
	value   *structpb.Struct
}

func envoyFilterPatches(f *networkingv1alpha3.EnvoyFilter) []configPatch {
	var out []configPatch
	for _, cp := range f.GetConfigPatches() {
		out = append(out, configPatch{applyTo: cp.GetApplyTo().String(), value: cp.GetPatch().GetValue()})
	}
	return out
}

// validateTypedConfig validates the typed configs a patch carries (an HTTP
// filter's, a cluster's protocol options), which ValidateAll of the outer message
// leaves as Any.
func validateTypedConfig(msg proto.Message) error {
	var anys []*anypb.Any
	switch m := msg.(type) {
	case *hcmv3.HttpFilter:
		if m.GetTypedConfig() == nil {
			return fmt.Errorf("HTTP filter %s has no typed_config", m.GetName())
		}
		anys = append(anys, m.GetTypedConfig())
	case *clusterv3.Cluster:
		for _, a := range m.GetTypedExtensionProtocolOptions() {
			anys = append(anys, a)
		}
	}
	for _, a := range anys {
		inner, err := a.UnmarshalNew()
		if err != nil {
			return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
		}
		if v, ok := inner.(validator); ok {
			if err := v.ValidateAll(); err != nil {
				return fmt.Errorf("%s: %w", a.GetTypeUrl(), err)
			}
		}
	}
	return nil
}

// bootstrapFile decodes the Envoy configuration at path strictly (protojson,
// unknown fields refused) into a v3 Bootstrap and validates it, its first
// listener's connection manager, and every HTTP filter's and cluster's typed
// config; it returns the Bootstrap and the connection manager.
func bootstrapFile(t *testing.T, path string) (*bootstrapv3.Bootstrap, *hcmv3.HttpConnectionManager) {
	t.Helper()
	j, err := yaml.YAMLToJSONStrict(readFile(t, path))
	if err != nil {
		t.Fatal(err)
	}
	var bs bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(j, &bs); err != nil {
		t.Fatalf("%s: not a v3 Bootstrap: %v", path, err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var hcm hcmv3.HttpConnectionManager
	if err := bs.GetStaticResources().GetListeners()[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	if err := hcm.ValidateAll(); err != nil {
		t.Fatalf("%s: the connection manager: %v", path, err)
	}
	for _, f := range hcm.GetHttpFilters() {
		if err := validateTypedConfig(f); err != nil {
			t.Fatalf("%s: filter %s: %v", path, f.GetName(), err)
		}
	}
	for _, c := range bs.GetStaticResources().GetClusters() {
		if err := validateTypedConfig(c); err != nil {
			t.Fatalf("%s: cluster %s: %v", path, c.GetName(), err)
		}
	}
	return &bs, &hcm
}
