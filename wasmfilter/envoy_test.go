//go:build !wasip1

package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	routerv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	httpwasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/wasm/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	wasmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/wasm/v3"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/wrapperspb"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// validator is what protoc-gen-validate generates on every Envoy message.
type validator interface{ ValidateAll() error }

// unpack decodes a typed_config and validates it: Bootstrap.ValidateAll does not look
// inside Any fields.
func unpack(t *testing.T, what string, a *anypb.Any, m proto.Message) {
	t.Helper()
	if err := a.UnmarshalTo(m); err != nil {
		t.Fatalf("%s: typed_config %s: %v", what, a.GetTypeUrl(), err)
	}
	if err := m.(validator).ValidateAll(); err != nil {
		t.Fatalf("%s: invalid: %v", what, err)
	}
}

// TestEnvoyConfig checks scripts/envoy/envoy.yaml the way Envoy reads it: YAML to
// JSON, protojson into a v3 Bootstrap with every typed_config resolved, protobuf
// validation of the bootstrap and of each typed_config, and then the parts the filter
// depends on: the wasm filter before the router, the V8 runtime, a failure policy,
// a plugin configuration the filter accepts (parsed natively, and started in the
// compiled module), and the decision cluster it names.
func TestEnvoyConfig(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "scripts", "envoy", "envoy.yaml")
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatalf("%s: to JSON: %v", path, err)
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		t.Fatalf("%s: not a v3 Bootstrap: %v", path, err)
	}
	if err := bs.ValidateAll(); err != nil {
		t.Fatalf("%s: invalid bootstrap: %v", path, err)
	}

	clusters := map[string]*clusterv3.Cluster{}
	for _, c := range bs.GetStaticResources().GetClusters() {
		clusters[c.GetName()] = c
	}
	listeners := bs.GetStaticResources().GetListeners()
	if len(listeners) != 1 {
		t.Fatalf("%s: %d listeners, want 1", path, len(listeners))
	}
	var hcm hcmv3.HttpConnectionManager
	unpack(t, "http_connection_manager", listeners[0].GetFilterChains()[0].GetFilters()[0].GetTypedConfig(), &hcm)
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); clusters[c] == nil {
				t.Errorf("route %v goes to cluster %q, which is not defined", r.GetMatch(), c)
			}
		}
	}

	filters := hcm.GetHttpFilters()
	if len(filters) != 2 || filters[0].GetName() != "envoy.filters.http.wasm" || filters[1].GetName() != "envoy.filters.http.router" {
		t.Fatalf("http_filters = %v, want the wasm filter, then the router", filters)
	}
	unpack(t, "router", filters[1].GetTypedConfig(), &routerv3.Router{})
	var w httpwasmv3.Wasm
	unpack(t, "wasm filter", filters[0].GetTypedConfig(), &w)

	pc := w.GetConfig()
	if got := pc.GetVmConfig().GetRuntime(); got != "envoy.wasm.runtime.v8" {
		t.Errorf("vm_config.runtime = %q, want envoy.wasm.runtime.v8", got)
	}
	if got := pc.GetVmConfig().GetCode().GetLocal().GetFilename(); !strings.HasSuffix(got, "tollgate.wasm") {
		t.Errorf("vm_config.code.local.filename = %q, want the plugin built by make wasm (dist/tollgate.wasm)", got)
	}
	// A VM that traps (a panic, or the Go runtime aborting: see golang/go#78513 in
	// README.md) must be replaced, not fail every later request of its worker.
	if got := pc.GetFailurePolicy(); got != wasmv3.FailurePolicy_FAIL_RELOAD {
		t.Errorf("failure_policy = %v, want FAIL_RELOAD", got)
	}
	var sv wrapperspb.StringValue
	if err := pc.GetConfiguration().UnmarshalTo(&sv); err != nil {
		t.Fatalf("configuration: want a google.protobuf.StringValue holding JSON: %v", err)
	}
	cfg, err := parseConfig([]byte(sv.GetValue()))
	if err != nil {
		t.Fatalf("the filter rejects the plugin configuration of %s: %v", path, err)
	}
	// The compiled module must accept it too, as Envoy starts it.
	vm := newWasmFilter(t, wasmhost.Options{PluginConfig: []byte(sv.GetValue())})
	if vm.StartPlugin() != types.OnPluginStartStatusOK {
		t.Fatalf("the compiled filter fails to start with the plugin configuration of %s; critical logs: %q", path, vm.GetCriticalLogs())
	}
	decision := clusters[cfg.cluster]
	if decision == nil {
		t.Fatalf("the plugin configuration's cluster %q is not defined", cfg.cluster)
	}
	if decision.GetType() != clusterv3.Cluster_STRICT_DNS {
		t.Errorf("cluster %q is %v, want STRICT_DNS", cfg.cluster, decision.GetType())
	}
}
