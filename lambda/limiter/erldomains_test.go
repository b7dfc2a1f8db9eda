package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/reload"
)

// FuzzParseERLDir reads a directory of two files, of any content: parseERLDir never
// panics, refuses a domain the two files share unless it merges, and every domain
// it returns has a validated policy.
func FuzzParseERLDir(f *testing.F) {
	for _, name := range []string{"basic.yaml", "another.yaml", "share_threshold.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "shared", "erl", "testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), true)
		f.Add(b, b, true)
		f.Add(b, b, false)
	}
	f.Add([]byte("domain: d\n"), []byte("- a\n- b\n"), false)
	f.Add([]byte(""), []byte("domain: d\ndescriptors: 3\n"), true)
	f.Fuzz(func(t *testing.T, a, b []byte, merge bool) {
		doc, err := json.Marshal([]reload.DirFile{{Name: "a.yaml", Data: a}, {Name: "b.yaml", Data: b}})
		if err != nil {
			t.Fatal(err)
		}
		set, err := parseERLDir(doc, merge)
		if err != nil {
			return
		}
		if !merge && bytes.Equal(a, b) {
			t.Fatalf("parseERLDir of one domain in two files without merge = %d domains, want an error", len(set.domains))
		}
		if len(set.domains) == 0 || len(set.domains) > 2 {
			t.Fatalf("parseERLDir of two files = %d domains", len(set.domains))
		}
		for name, d := range set.domains {
			if d.policy == nil || d.tr.Domain != name {
				t.Fatalf("domain %s = %+v, want its translation and a policy", name, d)
			}
		}
	})
}

// TestParseERLDirNoDescriptors loads a file whose domain has no descriptors, as ERL
// loads it, beside another file; two files of one domain are refused without merge,
// naming the setting.
func TestParseERLDirNoDescriptors(t *testing.T) {
	doc, err := json.Marshal([]reload.DirFile{{Name: "empty.yaml", Data: []byte("domain: quiet\n")}, {Name: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")}})
	if err != nil {
		t.Fatal(err)
	}
	set, err := parseERLDir(doc, false)
	if err != nil {
		t.Fatalf("parseERLDir with a domain of no descriptors = %v, want it loaded", err)
	}
	if d, ok := set.domains["quiet"]; !ok || d.policy == nil || len(set.domains) != 2 {
		t.Errorf("domains = %v, want quiet (no descriptors) and d", set.domains)
	}
	doc, err = json.Marshal([]reload.DirFile{{Name: "a.yaml", Data: []byte("domain: d\n")}, {Name: "b.yaml", Data: []byte("domain: d\n")}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseERLDir(doc, false); err == nil || !strings.Contains(err.Error(), "b.yaml") || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Errorf("parseERLDir of domain d in two files = %v, want an error naming b.yaml and MERGE_DOMAIN_CONFIG", err)
	}
}
