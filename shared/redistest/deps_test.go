package redistest_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestProductLeavesTestSupportOut checks that no package the product builds depends
// on test support: this package, internal/configmaptest, internal/envoyrlqs, the
// Envoy filter's wasm host, or a testing package.
func TestProductLeavesTestSupportOut(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{.ImportPath}}",
		"../../lambda/...", "../../wasmfilter").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps listed %d packages; the product's binaries have many more", len(deps))
	}
	for _, d := range deps {
		switch {
		case strings.HasSuffix(d, "/redistest"), strings.HasSuffix(d, "/configmaptest"), strings.HasSuffix(d, "/wasmhost"), strings.HasSuffix(d, "/envoyrlqs"),
			d == "testing", strings.HasPrefix(d, "testing/"):
			t.Errorf("the product depends on test support: %s", d)
		}
	}
}
