package engine_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestSetPolicyLogsFreshLimits checks that a policy change names, in the log, the
// limits that start afresh (a changed period), and not those that keep their count
// (a changed count).
func TestSetPolicyLogsFreshLimits(t *testing.T) {
	t.Parallel()
	parse := func(a, b string) *policy.Policy {
		p, err := policy.Parse([]byte(`domain: d
rules:
  - {name: a, match: {api_key: "*"}, limits: [{algorithm: fixed_window, rate: ` + a + `}]}
  - {name: b, match: {path: "*"}, limits: [{algorithm: fixed_window, rate: ` + b + `}]}
`))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	var log bytes.Buffer
	eng, err := engine.New(engine.Config{Policy: parse("10/min", "10/min"), Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.SetPolicy(parse("20/min", "10/h")); err != nil {
		t.Fatal(err)
	}
	got := log.String()
	if !strings.Contains(got, "afresh") || !strings.Contains(got, "rules[1].limits[0]") || strings.Contains(got, "rules[0]") {
		t.Errorf("SetPolicy(a's count raised, b's period changed) logged %q; want rules[1].limits[0] afresh, and rules[0] not", got)
	}
	log.Reset()
	if err := eng.SetPolicy(parse("30/min", "10/h")); err != nil {
		t.Fatal(err)
	}
	if got := log.String(); strings.Contains(got, "afresh") {
		t.Errorf("SetPolicy(a count raised) logged %q; want nothing afresh", got)
	}
}
