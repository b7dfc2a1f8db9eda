package policy_test

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestUnquotedStar checks that a YAML error from an unquoted * (read as an alias)
// tells the reader to quote it.
func TestUnquotedStar(t *testing.T) {
	t.Parallel()
	for name, in := range map[string]string{
		"flow":        "domain: d\nrules:\n  - name: a\n    match: {api_key: *}\n    limits: [{algorithm: gcra, rate: 1/s}]\n",
		"block":       "domain: d\nrules:\n  - name: a\n    match:\n      api_key: *\n    limits: [{algorithm: gcra, rate: 1/s}]\n",
		"alias-like":  "domain: d\nrules:\n  - name: a\n    match: {api_key: *key}\n    limits: [{algorithm: gcra, rate: 1/s}]\n",
		"anchor-like": "domain: d\nrules:\n  - name: a\n    match: {api_key: &}\n    limits: [{algorithm: gcra, rate: 1/s}]\n",
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := policy.Parse([]byte(in))
			if err == nil || !strings.Contains(err.Error(), `"*" must be quoted`) || !strings.Contains(err.Error(), "invalid YAML") {
				t.Errorf("Parse(%q) = %v, want an invalid YAML error saying \"*\" must be quoted", in, err)
			}
		})
	}
	if _, err := policy.Parse([]byte("domain: d\nrules: [\n")); err == nil || strings.Contains(err.Error(), "quoted") {
		t.Errorf("Parse() of an unclosed list = %v, want an error without the alias hint", err)
	}
}
