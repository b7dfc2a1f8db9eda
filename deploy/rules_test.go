package deploy_test

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
)

const (
	rulesPath  = "prometheus/tollgate-rules.yaml"
	runbookDoc = "../docs/dashboard.md"
	runbookURL = "https://github.com/tollgate-dev/tollgate/blob/main/docs/dashboard.md#"
)

// readRules parses the rules file as Prometheus does when it loads it (rulefmt:
// strict YAML, each expression through the PromQL parser, annotation templates
// parsed).
func readRules(t *testing.T) *rulefmt.RuleGroups {
	t.Helper()
	rgs, errs := rulefmt.ParseFile(rulesPath, false, model.UTF8Validation, promqlParser, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, err := range errs {
		t.Error(err)
	}
	if rgs == nil {
		t.FailNow()
	}
	return rgs
}

// ruleQueries returns every rule's expression.
func ruleQueries(t *testing.T) []query {
	t.Helper()
	var qs []query
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			qs = append(qs, query{fmt.Sprintf("rule %s%s", r.Alert, r.Record), r.Expr})
		}
	}
	return qs
}

// TestRules checks that the rules load in Prometheus and that every alert has a
// severity, a summary, a description and a runbook_url whose anchor is a heading of
// docs/dashboard.md; and that the alerts operators rely on are there.
func TestRules(t *testing.T) {
	doc, err := os.ReadFile(runbookDoc)
	if err != nil {
		t.Fatal(err)
	}
	headings := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		if h, ok := strings.CutPrefix(strings.TrimSpace(line), "### "); ok {
			headings[strings.ToLower(h)] = true
		}
	}
	alerts := map[string]bool{}
	for _, g := range readRules(t).Groups {
		for _, r := range g.Rules {
			if r.Alert == "" {
				continue
			}
			if alerts[r.Alert] {
				t.Errorf("alert %s is defined twice", r.Alert)
			}
			alerts[r.Alert] = true
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("alert %s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
			anchor, ok := strings.CutPrefix(r.Annotations["runbook_url"], runbookURL)
			if !ok || anchor != strings.ToLower(r.Alert) {
				t.Errorf("alert %s: runbook_url %q, want %s%s", r.Alert, r.Annotations["runbook_url"], runbookURL, strings.ToLower(r.Alert))
			}
			if !headings[anchor] {
				t.Errorf("alert %s: %s has no heading ### %s for its runbook", r.Alert, runbookDoc, r.Alert)
			}
		}
	}
	for _, name := range []string{
		"TollgateDecisionsUnavailable", "TollgateBreakerOpen", "TollgateFailureModeDeciding",
		"TollgateRedisErrors", "TollgateRedisLatencyHigh", "TollgateDecisionLatencyHigh",
		"TollgatePolicyReloadFailing", "TollgateDenyRateSpike",
	} {
		if !alerts[name] {
			t.Errorf("%s lacks alert %s", rulesPath, name)
		}
	}
}
