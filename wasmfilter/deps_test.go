//go:build !wasip1

package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// goTool runs the go command in this package's directory for GOOS=wasip1 GOARCH=wasm.
func goTool(t *testing.T, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("go")
	if err != nil {
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

// TestBuildsForWasip1 compiles the filter for GOOS=wasip1 GOARCH=wasm, the nearest the
// standard toolchain gets to TinyGo's wasi target.
func TestBuildsForWasip1(t *testing.T) {
	t.Parallel()
	goTool(t, "build", "-o", filepath.Join(t.TempDir(), "tollgate.wasm"), ".")
}

// TestDependencies keeps the filter's imports TinyGo-friendly: no Redis client, no
// networking (the host does the I/O), no gRPC or protobuf, and no encoding/json from
// any importer: the filter reads JSON with shared/jsonv and writes it by hand.
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
			strings.HasPrefix(pkg, "google.golang.org/grpc") ||
			strings.HasPrefix(pkg, "google.golang.org/protobuf")
		if forbidden {
			t.Errorf("the filter depends on %s (imported by %s); it must stay TinyGo-safe", pkg, strings.Join(importers[pkg], ", "))
		}
	}
	for _, want := range []string{"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm", "github.com/tollgate-dev/tollgate/shared/jsonv", "github.com/tollgate-dev/tollgate/shared/memstore"} {
		if !slices.Contains(all, want) {
			t.Errorf("go list -deps does not list %s; is the check looking at the filter?", want)
		}
	}
}
