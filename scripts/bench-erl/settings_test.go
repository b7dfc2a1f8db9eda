package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestERLSettingsDocumented reads the settings of the envoyproxy/ratelimit this
// benchmark builds (its src/settings/settings.go, from the module proxy) and checks
// that docs/erl.md's table names every one: by name, or by the family it belongs to
// (`MEMCACHE_*`).
func TestERLSettingsDocumented(t *testing.T) {
	module, _, _ := strings.Cut(erlModule, "/src/")
	version := erlModule[strings.Index(erlModule, "@"):]
	out, err := exec.Command("go", "mod", "download", "-json", module+version).Output()
	if err != nil {
		t.Fatalf("go mod download %s%s: %v", module, version, err)
	}
	var m struct{ Dir string }
	if err := json.Unmarshal(out, &m); err != nil || m.Dir == "" {
		t.Fatalf("go mod download -json = %s, %v", out, err)
	}
	src, err := os.ReadFile(filepath.Join(m.Dir, "src", "settings", "settings.go"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "erl.md"))
	if err != nil {
		t.Fatal(err)
	}
	table := string(doc)
	families := regexp.MustCompile("`([A-Z0-9_]+_)\\*`").FindAllStringSubmatch(table, -1)
	names := regexp.MustCompile(`envconfig:"([A-Z0-9_]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(names) < 100 {
		t.Fatalf("found %d settings in ERL's settings.go, want its 100 and more", len(names))
	}
	for _, n := range names {
		name := n[1]
		if strings.Contains(table, "`"+name+"`") {
			continue
		}
		covered := false
		for _, f := range families {
			covered = covered || strings.HasPrefix(name, f[1])
		}
		if !covered {
			t.Errorf("docs/erl.md does not name ERL's setting %s", name)
		}
	}
}
