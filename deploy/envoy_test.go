package deploy_test

import (
	"fmt"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	networkingv1alpha3 "istio.io/api/networking/v1alpha3"
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
