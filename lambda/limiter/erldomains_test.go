package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
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
