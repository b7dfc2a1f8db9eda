package policy_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestRLQS checks a rule's rlqs block: its default, its field, and every limit or
// rule it cannot serve refused with the rule and the field named.
func TestRLQS(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte("domain: fleet\nrules:\n  - {name: a, match: {tenant: '*'}, rlqs: {}, limits: [{algorithm: fixed_window, rate: 6000/10s}]}\n  - {name: b, rlqs: {reporting_interval: 10s}, limits: [{algorithm: fixed_window, rate: 5/2s}]}\n  - {name: c, limits: [{algorithm: gcra, rate: 5/s}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if q := p.Rules[0].RLQS; q == nil || q.ReportingInterval != 5*time.Second {
		t.Errorf("rule a: RLQS = %+v, want the default reporting interval 5s", q)
	}
	if q := p.Rules[1].RLQS; q == nil || q.ReportingInterval != 10*time.Second {
		t.Errorf("rule b: RLQS = %+v, want reporting interval 10s", q)
	}
	if p.Rules[2].RLQS != nil {
		t.Errorf("rule c: RLQS = %+v, want nil (no rlqs block)", p.Rules[2].RLQS)
	}
	for _, tc := range []struct {
		name, rule, path, want string
	}{
		{"null", "rlqs: null, limits: [{algorithm: fixed_window, rate: 5/10s}]", "rules[0].rlqs", "write rlqs: {}"},
		{"not a mapping", "rlqs: yes, limits: [{algorithm: fixed_window, rate: 5/10s}]", "rules[0].rlqs", "want a mapping"},
		{"unknown field", "rlqs: {interval: 5s}, limits: [{algorithm: fixed_window, rate: 5/10s}]", "rules[0].rlqs.interval", "known fields: reporting_interval"},
		{"fraction of a second", "rlqs: {reporting_interval: 1500ms}, limits: [{algorithm: fixed_window, rate: 5/10s}]", "rules[0].rlqs.reporting_interval", "whole seconds"},
		{"interval too long", "rlqs: {reporting_interval: 2m}, limits: [{algorithm: fixed_window, rate: 5/10s}]", "rules[0].rlqs.reporting_interval", ""},
		{"gcra", "rlqs: {}, limits: [{algorithm: gcra, rate: 5/s}]", "rules[0].limits[0].algorithm", `rule "r": rlqs grants units of fixed_window limits only, not gcra`},
		{"sliding window", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 5/10s}, {algorithm: sliding_window, rate: 5/10s}]", "rules[0].limits[1].algorithm", "fixed_window limits only"},
		{"short window", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 5/s}]", "rules[0].limits[0].rate", "at least 2s"},
		{"fraction of a second window", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 5/2500ms}]", "rules[0].limits[0].rate", "whole seconds"},
		{"calendar", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 5/day, calendar: {timezone: UTC}}]", "rules[0].limits[0].calendar", "remove calendar or rlqs"},
		{"lease", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 50/10s, lease: {units: 5, for: 1s}}]", "rules[0].limits[0].lease", "remove lease"},
		{"record", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 50/10s, record: path}]", "rules[0].limits[0].record", "remove record"},
		{"shadow", "rlqs: {}, shadow: true, limits: [{algorithm: fixed_window, rate: 50/10s}]", "rules[0].rlqs", "remove rlqs, or shadow"},
		{"settle", "rlqs: {}, settle: true, limits: [{algorithm: fixed_window, rate: 50/10s}]", "rules[0].rlqs", "remove rlqs, or settle"},
		{"unlimited", "rlqs: {}, unlimited: true", "rules[0].rlqs", "remove rlqs, or unlimited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte("domain: fleet\nrules:\n  - {name: r, " + tc.rule + "}\n"))
			ve, ok := errors.AsType[*policy.ValidationError](err)
			if !ok {
				t.Fatalf("Parse() = %v, want a ValidationError", err)
			}
			for _, pr := range ve.Problems {
				if pr.Path == tc.path && strings.Contains(pr.Msg, tc.want) {
					return
				}
			}
			t.Errorf("Parse() = %v, want a problem at %s saying %q", err, tc.path, tc.want)
		})
	}
}
