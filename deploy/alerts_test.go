package deploy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

// TestAlertsFire evaluates each alert of the rules file as Prometheus does, every
// minute on the series of a scenario, and checks which alerts fire at the end: the
// thresholds, the for: durations and the label sets the annotations name, on
// series shaped like the service's (see TestServedMetrics for their names).
func TestAlertsFire(t *testing.T) {
	byName := map[string]rulefmt.Rule{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			byName[r.Alert] = r
		}
	}
	const (
		d = `job="tollgate",domain="d"`
		a = `job="tollgate",instance="a:8080"`
		b = `job="tollgate",instance="b:8080"`
	)
	// Counters go up by 60 a minute for 1/s.
	tests := []struct {
		alert  string
		name   string
		series string
		at     int      // minutes
		want   []string // the firing alerts' labels, alertname and severity left out
	}{
		{"TollgateDecisionsUnavailable", "5% unavailable", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x20
			tollgate_decisions_total{` + d + `,rule="",result="unavailable"} 0+300x20`,
			15, []string{`{domain="d", job="tollgate"}`}},
		{"TollgateDecisionsUnavailable", "0.5% unavailable", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x20
			tollgate_decisions_total{` + d + `,rule="",result="unavailable"} 0+30x20`,
			15, nil},
		{"TollgateDecisionsUnavailable", "5% unavailable for 3m", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x20
			tollgate_decisions_total{` + d + `,rule="",result="unavailable"} 0x17 0+300x3`,
			20, nil},

		{"TollgateBreakerOpen", "open for 3m", `
			tollgate_breaker_state{` + a + `,node="n1",state="open"} 0 0 1 1 1 1
			tollgate_breaker_state{` + a + `,node="n2",state="open"} 0 0 0 0 0 0`,
			5, []string{`{instance="a:8080", job="tollgate", node="n1"}`}},
		{"TollgateBreakerOpen", "open for a moment", `
			tollgate_breaker_state{` + a + `,node="n1",state="open"} 0 0 0 0 1 0`,
			5, nil},

		{"TollgateFailureModeDeciding", "local mode deciding", `
			tollgate_failure_mode_activations_total{` + a + `,mode="local"} 0+60x20`,
			10, []string{`{job="tollgate", mode="local"}`}},
		{"TollgateFailureModeDeciding", "not since 5m", `
			tollgate_failure_mode_activations_total{` + a + `,mode="local"} 0+60x10 600x10`,
			20, nil},

		{"TollgateRedisErrors", "2% of round trips", `
			tollgate_redis_errors_total{` + a + `} 0+120x20
			tollgate_redis_seconds_count{` + a + `} 0+6000x20`,
			15, []string{`{job="tollgate"}`}},
		{"TollgateRedisErrors", "0.5% of round trips", `
			tollgate_redis_errors_total{` + a + `} 0+30x20
			tollgate_redis_seconds_count{` + a + `} 0+6000x20`,
			15, nil},

		{"TollgateRedisLatencyHigh", "p99 past 25.6ms", `
			tollgate_redis_seconds_bucket{` + a + `,le="0.0128"} 0+5900x20
			tollgate_redis_seconds_bucket{` + a + `,le="0.0256"} 0+5930x20
			tollgate_redis_seconds_bucket{` + a + `,le="0.0512"} 0+6000x20
			tollgate_redis_seconds_bucket{` + a + `,le="+Inf"} 0+6000x20`,
			15, []string{`{job="tollgate"}`}},
		{"TollgateRedisLatencyHigh", "p99 under 12.8ms", `
			tollgate_redis_seconds_bucket{` + a + `,le="0.0128"} 0+5999x20
			tollgate_redis_seconds_bucket{` + a + `,le="0.0256"} 0+6000x20
			tollgate_redis_seconds_bucket{` + a + `,le="+Inf"} 0+6000x20`,
			15, nil},

		{"TollgateDecisionLatencyHigh", "p99 past 25.6ms", `
			tollgate_decision_seconds_bucket{` + a + `,le="0.0256"} 0+5900x20
			tollgate_decision_seconds_bucket{` + a + `,le="0.0512"} 0+6000x20
			tollgate_decision_seconds_bucket{` + a + `,le="+Inf"} 0+6000x20`,
			15, []string{`{job="tollgate"}`}},
		{"TollgateDecisionLatencyHigh", "p99 under 12.8ms", `
			tollgate_decision_seconds_bucket{` + a + `,le="0.0128"} 0+6000x20
			tollgate_decision_seconds_bucket{` + a + `,le="+Inf"} 0+6000x20`,
			15, nil},

		{"TollgatePolicyReloadFailing", "one invalid reload", `
			tollgate_policy_reloads_total{` + a + `,result="applied"} 0 1 1 1 1 1
			tollgate_policy_reloads_total{` + a + `,result="invalid"} 0 0 0 1 1 1`,
			5, []string{`{instance="a:8080", job="tollgate", result="invalid"}`}},
		{"TollgatePolicyReloadFailing", "applied reloads", `
			tollgate_policy_reloads_total{` + a + `,result="applied"} 0 1 2 3 4 5
			tollgate_policy_reloads_total{` + a + `,result="invalid"} 0x5`,
			5, nil},

		{"TollgatePolicyDiverged", "two policies", `
			tollgate_policy_info{` + a + `,sha256="x"} 1x20
			tollgate_policy_info{` + b + `,sha256="y"} 1x20`,
			15, []string{`{job="tollgate"}`}},
		{"TollgatePolicyDiverged", "one policy", `
			tollgate_policy_info{` + a + `,sha256="x"} 1x20
			tollgate_policy_info{` + b + `,sha256="x"} 1x20`,
			15, nil},

		{"TollgateDenyRateSpike", "10/s to 100/s", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x120
			tollgate_decisions_total{` + d + `,rule="r",result="denied"} 0+600x60 36000+6000x60`,
			75, []string{`{domain="d", job="tollgate", rule="r"}`}},
		{"TollgateDenyRateSpike", "a rule's first denials", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x120
			tollgate_decisions_total{` + d + `,rule="r",result="denied"} _x60 0+1200x60`,
			75, []string{`{domain="d", job="tollgate", rule="r"}`}},
		{"TollgateDenyRateSpike", "steady 10/s", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+6000x120
			tollgate_decisions_total{` + d + `,rule="r",result="denied"} 0+600x120`,
			75, nil},
		{"TollgateDenyRateSpike", "2/s to 6/s, under 5%", `
			tollgate_decisions_total{` + d + `,rule="r",result="allowed"} 0+60000x120
			tollgate_decisions_total{` + d + `,rule="r",result="denied"} 0+120x60 7200+360x60`,
			75, nil},

		{"TollgateIdentityFallbacks", "fallbacks for 20m", `
			tollgate_identity_fallbacks_total{` + a + `} 0+6x25`,
			20, []string{`{job="tollgate"}`}},
		{"TollgateIdentityFallbacks", "none", `
			tollgate_identity_fallbacks_total{` + a + `} 0x25`,
			20, nil},

		{"TollgateUnreplicated", "unreplicated for 20m", `
			tollgate_unreplicated_total{` + a + `} 0+6x25`,
			20, []string{`{job="tollgate"}`}},
		{"TollgateUnreplicated", "for 10m only", `
			tollgate_unreplicated_total{` + a + `} 0x10 0+6x15`,
			20, nil},
	}
	seen := map[string]bool{}
	for _, tc := range tests {
		seen[tc.alert] = true
		t.Run(tc.alert+"/"+tc.name, func(t *testing.T) {
			r, ok := byName[tc.alert]
			if !ok {
				t.Fatalf("%s has no alert %s", rulesPath, tc.alert)
			}
			var load strings.Builder
			load.WriteString("load 1m\n")
			for l := range strings.Lines(strings.TrimSpace(tc.series)) {
				load.WriteString("  " + strings.TrimSpace(l) + "\n")
			}
			got := evalAlert(t, r, load.String(), tc.at)
			if !slices.Equal(got, tc.want) {
				t.Errorf("%s at %dm = %q, want %q", tc.alert, tc.at, got, tc.want)
			}
		})
	}
	for name := range byName {
		if !seen[name] {
			t.Errorf("alert %s has no scenario in TestAlertsFire", name)
		}
	}
}

// evalAlert evaluates rule r every minute from 0 to at on the series of load and
// returns the label sets of the alerts firing at the end, sorted, without
// alertname and severity. It fails t if an annotation's template does not expand.
func evalAlert(t *testing.T, r rulefmt.Rule, load string, at int) []string {
	t.Helper()
	storage := promqltest.LoadedStorage(t, load)
	engine := promqltest.NewTestEngine(t, false, 0, 1e6)
	expr, err := promqlParser.ParseExpr(r.Expr)
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	rule := rules.NewAlertingRule(r.Alert, expr, time.Duration(r.For), time.Duration(r.KeepFiringFor),
		labels.FromMap(r.Labels), labels.FromMap(r.Annotations), labels.EmptyLabels(), "", false, log)
	query := rules.EngineQueryFunc(engine, storage)
	for m := 0; m <= at; m++ {
		if _, err := rule.Eval(context.Background(), 0, time.Unix(0, 0).Add(time.Duration(m)*time.Minute), query, nil, 0); err != nil {
			t.Fatalf("evaluate at %dm: %v", m, err)
		}
	}
	var got []string
	for _, al := range rule.ActiveAlerts() {
		if al.State != rules.StateFiring {
			continue
		}
		al.Annotations.Range(func(l labels.Label) {
			if strings.Contains(l.Value, "error expanding template") || strings.Contains(l.Value, "<no value>") {
				t.Errorf("annotation %s = %q", l.Name, l.Value)
			}
		})
		got = append(got, fmt.Sprint(labels.NewBuilder(al.Labels).Del(labels.AlertName, "severity").Labels()))
	}
	slices.Sort(got)
	return got
}
