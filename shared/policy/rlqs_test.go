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
		{"periods not multiples", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 100/4s}, {algorithm: fixed_window, rate: 130/6s}]", "rules[0].limits[1].rate", `rule "r": limits[0] and limits[1]: rlqs shares the limits one bucket reaches in the windows of the shortest, so each longer period must be a multiple of it (100/4s and 130/6s are not); make 6s a multiple of 4s`},
		{"shorter window with the larger count", "rlqs: {}, limits: [{algorithm: fixed_window, rate: 100/10s}, {algorithm: fixed_window, rate: 1000/2s}]", "rules[0].limits[1].rate", "100/10s admits at most 100 in any 2s, so 1000/2s never denies; rlqs needs the shorter window to have the smaller count: remove 1000/2s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte("domain: fleet\nrules:\n  - {name: r, " + tc.rule + "}\n"))
			wantProblem(t, err, tc.path, tc.want)
		})
	}
}

// TestRLQSPeriods checks the periods of the rlqs limits one bucket can reach, in
// one rule or in two: each longer period a multiple of the shorter, with a larger
// count; rules that cannot match one bucket are not compared.
func TestRLQSPeriods(t *testing.T) {
	t.Parallel()
	rule := func(name, match, rate string) string {
		return "  - {name: " + name + ", match: " + match + ", rlqs: {}, limits: [{algorithm: fixed_window, rate: " + rate + "}]}\n"
	}
	for _, tc := range []struct {
		name, rules, path, want string // want "": no problem
	}{
		{"one rule, multiples", "  - {name: r, rlqs: {}, limits: [{algorithm: fixed_window, rate: 100/2s}, {algorithm: fixed_window, rate: 1000/60s}]}\n", "", ""},
		{"two rules, multiples", rule("a", "{tenant: '*'}", "100/2s") + rule("b", "{tenant: '*'}", "1000/60s"), "", ""},
		{"two rules, not multiples", rule("a", "{tenant: '*'}", "100/4s") + rule("b", "{tenant: acme}", "130/6s"), "rules[1].limits[0].rate",
			`rules "a" and "b" can both match one bucket: rlqs shares the limits one bucket reaches in the windows of the shortest, so each longer period must be a multiple of it (100/4s and 130/6s are not); make 6s a multiple of 4s; or make their matches exclusive`},
		{"two rules, shorter window with the larger count", rule("a", "{}", "1000/2s") + rule("b", "{tenant: '*'}", "100/10s"), "rules[1].limits[0].rate", "so 1000/2s never denies"},
		{"two rules, exclusive", rule("a", "{tenant: [acme, initech]}", "100/4s") + rule("b", "{tenant: globex}", "130/6s"), "", ""},
		{"two rules, one replaces the other", rule("a", "{tenant: '*'}", "100/4s") + "  - {name: b, match: {tenant: acme}, replaces: [a], rlqs: {}, limits: [{algorithm: fixed_window, rate: 130/6s}]}\n", "", ""},
		{"two rules, prefixes taken to meet", rule("a", "{tenant: 'a*'}", "100/4s") + rule("b", "{tenant: 'b*'}", "130/6s"), "rules[1].limits[0].rate", "make 6s a multiple of 4s"},
		{"a rule without rlqs", rule("a", "{tenant: '*'}", "100/4s") + "  - {name: b, limits: [{algorithm: fixed_window, rate: 130/6s}]}\n", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := policy.Parse([]byte("domain: fleet\nrules:\n" + tc.rules))
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Parse() = %v, want no error", err)
				}
				return
			}
			wantProblem(t, err, tc.path, tc.want)
		})
	}
}

// wantProblem fails t unless err is a ValidationError with a problem at path whose
// message holds want.
func wantProblem(t *testing.T, err error, path, want string) {
	t.Helper()
	ve, ok := errors.AsType[*policy.ValidationError](err)
	if !ok {
		t.Fatalf("Parse() = %v, want a ValidationError", err)
	}
	for _, pr := range ve.Problems {
		if pr.Path == path && strings.Contains(pr.Msg, want) {
			return
		}
	}
	t.Errorf("Parse() = %v, want a problem at %s saying %q", err, path, want)
}
