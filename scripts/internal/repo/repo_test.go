package repo

import (
	"os"
	"path/filepath"
	"testing"
)

// TestRoot finds the product's root from inside the tools module, passing over the
// tools' own go.mod, and fails outside any tollgate checkout.
func TestRoot(t *testing.T) {
	t.Parallel()
	want, err := filepath.Abs(filepath.Join("..", "..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{".", "../..", "../../.."} {
		got, err := Root(dir)
		if err != nil || got != want {
			t.Errorf("Root(%q) = %q, %v, want %q", dir, got, err, want)
		}
	}
	other := t.TempDir()
	if err := os.WriteFile(filepath.Join(other, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := Root(other); err == nil {
		t.Errorf("Root(%q) = %q, nil error, want one", other, got)
	}
}
