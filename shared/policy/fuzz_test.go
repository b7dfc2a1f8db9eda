package policy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// FuzzParse checks that Parse never panics, that it returns either a policy or a
// *ValidationError with problems, and that every policy it accepts compiles to meters
// that algo accepts and keys that stay in their hash tag. The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse(data)
		if err != nil {
			if p != nil {
				t.Fatalf("Parse() = %v, %v; want a nil policy with the error", p, err)
			}
			ve, ok := errors.AsType[*policy.ValidationError](err)
			if !ok || len(ve.Problems) == 0 {
				t.Fatalf("Parse() error = %#v, want a *ValidationError with problems", err)
			}
			for _, pr := range ve.Problems {
				if pr.Msg == "" {
					t.Fatalf("Parse() problem %+v has no message", pr)
				}
			}
			return
		}
		if p == nil || p.Domain == "" || len(p.Rules) == 0 {
			t.Fatalf("Parse() = %+v, nil; want a policy with a domain and rules", p)
		}
		// A request that carries every attribute with the value each rule wants, and
		// one with hostile values.
		exact, wild := map[string]string{}, map[string]string{}
		for _, a := range p.Attributes() {
			wild[a] = "{x}:\n"
		}
		for _, r := range p.Rules {
			for _, m := range r.Meters {
				if err := m.Meter.Validate(); err != nil {
					t.Fatalf("rule %s: meter %v: Validate() = %v", r.Name, m, err)
				}
			}
			for a, v := range r.Match {
				exact[a] = v.Text
			}
		}
		for _, attrs := range []map[string]string{exact, wild} {
			for _, m := range p.Match(attrs) {
				if len(m.Meters) != len(m.Rule.Meters) {
					t.Fatalf("Match(%q) rule %s: %d meters, want %d", attrs, m.Rule.Name, len(m.Meters), len(m.Rule.Meters))
				}
				for _, k := range keys(m) {
					tag := algo.HashTag(k)
					if !strings.HasPrefix(k, p.Prefix+"{"+tag+"}"+m.Rule.Name+":") {
						t.Fatalf("Match(%q) rule %s: key %q does not start with prefix, tag and rule", attrs, m.Rule.Name, k)
					}
				}
			}
		}
	})
}
