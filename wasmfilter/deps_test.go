//go:build !wasip1

package main

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goTool runs the go command in this package's directory for GOOS=wasip1 GOARCH=wasm.
func goTool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("go")
	if err != nil {
		// Nothing skips under CI: the filter must be checked where it is built.
		if os.Getenv("CI") == "true" {
			t.Fatalf("the go command is not on PATH: %v", err)
		}
		t.Skip("the go command is not on PATH")
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestModuleABI checks the module `make wasm` builds (the same go build, made once per
// test binary) as Envoy would load it: a WASI reactor with the proxy-wasm 0.2.x ABI,
// the callbacks the filter lives in, and the host calls it makes.
func TestModuleABI(t *testing.T) {
	mod := filterRuntime(t).Module()
	exports := mod.ExportedFunctions()
	for _, name := range []string{"_initialize", "proxy_abi_version_0_2_0", "proxy_on_memory_allocate",
		"proxy_on_context_create", "proxy_on_vm_start", "proxy_on_configure",
		"proxy_on_request_headers", "proxy_on_response_headers", "proxy_on_http_call_response",
		"proxy_on_tick", "proxy_on_log", "proxy_on_done", "proxy_on_delete"} {
		if _, ok := exports[name]; !ok {
			t.Errorf("the module does not export %s", name)
		}
	}
	if _, ok := exports["_start"]; ok {
		t.Errorf("the module exports _start: a command, not the reactor -buildmode=c-shared makes; Envoy would run main and exit")
	}
	imports := map[string]bool{}
	for _, fn := range mod.ImportedFunctions() {
		module, name, _ := fn.Import()
		imports[module+"."+name] = true
	}
	for _, name := range []string{"env.proxy_http_call", "env.proxy_send_local_response", "env.proxy_set_tick_period_milliseconds",
		"env.proxy_get_shared_data", "env.proxy_set_shared_data", "env.proxy_define_metric", "env.proxy_increment_metric"} {
		if !imports[name] {
			t.Errorf("the module does not import %s", name)
		}
	}
	for name := range imports {
		module, _, _ := strings.Cut(name, ".")
		if module != "env" && module != "wasi_snapshot_preview1" {
			t.Errorf("the module imports %s; Envoy provides only env (proxy-wasm) and wasi_snapshot_preview1", name)
		}
	}
}

// TestDependencies keeps the filter small and wasip1-safe: no Redis client, no
// networking (the host does the I/O), no gRPC or protobuf, and no encoding/json from
// any importer: the filter reads JSON with internal/jsonv and writes it by hand.
func TestDependencies(t *testing.T) {
	t.Parallel()
	out := goTool(t, "list", "-deps", "-f", "{{.ImportPath}}:{{range .Imports}} {{.}}{{end}}", ".")
	importers := map[string][]string{} // package -> the packages that import it
	var all []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		pkg, imports, _ := strings.Cut(line, ":")
		all = append(all, pkg)
		for _, imp := range strings.Fields(imports) {
			importers[imp] = append(importers[imp], pkg)
		}
	}
	for _, pkg := range all {
		forbidden := pkg == "net" || strings.HasPrefix(pkg, "net/") ||
			pkg == "encoding/json" || pkg == "os/exec" ||
			strings.HasPrefix(pkg, "github.com/redis/go-redis") ||
			strings.HasPrefix(pkg, "github.com/tetratelabs/wazero") ||
			strings.HasPrefix(pkg, "google.golang.org/grpc") ||
			strings.HasPrefix(pkg, "google.golang.org/protobuf")
		if forbidden {
			t.Errorf("the filter depends on %s (imported by %s); it must stay small and wasip1-safe", pkg, strings.Join(importers[pkg], ", "))
		}
	}
	for _, want := range []string{"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm", "github.com/tollgate-dev/tollgate/wasmfilter/internal/jsonv", "github.com/tollgate-dev/tollgate/shared/memstore"} {
		if !slices.Contains(all, want) {
			t.Errorf("go list -deps does not list %s; is the check looking at the filter?", want)
		}
	}
}
