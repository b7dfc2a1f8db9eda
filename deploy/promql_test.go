package deploy_test

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// promqlParser is Prometheus's own PromQL parser with its default functions.
var promqlParser = parser.NewParser(parser.Options{})

// targetLabels are the labels Prometheus adds to every series it scrapes: queries
// may match and group by them though /metrics does not show them.
var targetLabels = map[string]bool{"job": true, "instance": true}

var (
	// intervalVar is one of Grafana's interval variables, which stand for a duration.
	intervalVar = regexp.MustCompile(`\$__(rate_interval|interval|range)\b`)
	// templateVar is a dashboard variable ($job, ${job}, [[job]]); the dashboard
	// uses them only inside regular-expression matchers.
	templateVar = regexp.MustCompile(`\$\{?\w+\}?|\[\[\w+\]\]`)
	// plainAlternation is a regular expression that only lists values: a|b|c.
	plainAlternation = regexp.MustCompile(`^[\w.-]+(\|[\w.-]+)*$`)
)

// parseQuery parses a dashboard's or a rule's expression with Grafana's variables
// replaced: intervals by 5m, dashboard variables by .* (match anything).
func parseQuery(expr string) (parser.Expr, error) {
	expr = intervalVar.ReplaceAllString(expr, "5m")
	expr = templateVar.ReplaceAllString(expr, ".*")
	return promqlParser.ParseExpr(expr)
}

// resolve finds the family a series name of a query belongs to: the family of that
// name, or for name_bucket, name_sum and name_count the histogram (or, but for
// _bucket, summary) family name. extra is le for _bucket. A bare histogram name is
// no series.
func resolve(fams map[string]family, name string) (famName string, f family, extra string, ok bool) {
	if f, ok := fams[name]; ok && f.typ != dto.MetricType_HISTOGRAM && f.typ != dto.MetricType_SUMMARY {
		return name, f, "", true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(name, suffix)
		if !found {
			continue
		}
		f, ok := fams[base]
		switch {
		case ok && f.typ == dto.MetricType_HISTOGRAM && suffix == "_bucket":
			return base, f, "le", true
		case ok && (f.typ == dto.MetricType_HISTOGRAM || f.typ == dto.MetricType_SUMMARY) && suffix != "_bucket":
			return base, f, "", true
		}
	}
	return "", family{}, "", false
}

// selectorName returns the metric name a vector selector selects.
func selectorName(vs *parser.VectorSelector) string {
	if vs.Name != "" {
		return vs.Name
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
			return m.Value
		}
	}
	return ""
}

// labelsUnder returns the labels the series selected under node may carry, and
// false if some series is not served (which checkServed reports once).
func labelsUnder(fams map[string]family, node parser.Node) (map[string]bool, bool) {
	out := maps.Clone(targetLabels)
	served := true
	parser.Inspect(node, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			_, f, extra, ok := resolve(fams, selectorName(vs))
			served = served && ok
			if ok {
				for l := range f.labels {
					out[l] = true
				}
				if extra != "" {
					out[extra] = true
				}
			}
		}
		return nil
	})
	return out, served
}

// checkServed checks expr against the families of a scrape: every series it
// selects is served; every label it matches is one of its series' labels, and
// every value it matches exactly (or in a plain a|b list) is one the series took;
// every label it groups or matches by is one of the labels under that operator. It
// returns the problems and the families expr uses.
func checkServed(expr parser.Expr, fams map[string]family) (problems []string, used map[string]bool) {
	used = map[string]bool{}
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			name := selectorName(n)
			famName, f, extra, ok := resolve(fams, name)
			if !ok {
				problems = append(problems, fmt.Sprintf("%s: no such series in /metrics", n))
				return nil
			}
			used[famName] = true
			for _, m := range n.LabelMatchers {
				if m.Name == labels.MetricName || targetLabels[m.Name] || m.Name == extra {
					continue
				}
				values, ok := f.labels[m.Name]
				if !ok {
					problems = append(problems, fmt.Sprintf("%s: %s has no label %s (it has %v)", n, name, m.Name, slices.Sorted(maps.Keys(f.labels))))
					continue
				}
				var want []string
				switch {
				case m.Type == labels.MatchEqual:
					want = []string{m.Value}
				case m.Type == labels.MatchRegexp && plainAlternation.MatchString(m.Value):
					want = strings.Split(m.Value, "|")
				}
				for _, v := range want {
					if !values[v] {
						problems = append(problems, fmt.Sprintf("%s: no %s series with %s=%q (served: %v)", n, name, m.Name, v, slices.Sorted(maps.Keys(values))))
					}
				}
			}
		case *parser.AggregateExpr:
			have, served := labelsUnder(fams, n.Expr)
			for _, l := range n.Grouping {
				if served && !have[l] {
					problems = append(problems, fmt.Sprintf("%s: groups by %s, which none of its series has", n, l))
				}
			}
		case *parser.BinaryExpr:
			if n.VectorMatching == nil {
				return nil
			}
			have, served := labelsUnder(fams, n)
			for _, l := range n.VectorMatching.MatchingLabels {
				if served && !have[l] {
					problems = append(problems, fmt.Sprintf("%s: matches on %s, which none of its series has", n, l))
				}
			}
		}
		return nil
	})
	return problems, used
}
