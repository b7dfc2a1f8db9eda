package deploy_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	grafana "github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/promqltest"
)

const dashboardPath = "grafana/tollgate.json"

// dashboard is the part of Grafana's dashboard JSON the tests read.
type dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []variable `json:"list"`
	} `json:"templating"`
}

type panel struct {
	ID         int    `json:"id"`
	Type       string `json:"type"`
	Title      string `json:"title"`
	Datasource *struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	} `json:"datasource"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

type variable struct {
	Name  string          `json:"name"`
	Type  string          `json:"type"`
	Query json.RawMessage `json:"query"`
}

// query is one PromQL expression of the artefacts and where it is.
type query struct{ where, expr string }

// labelValues is a query variable's label_values(SELECTOR, LABEL).
var labelValues = regexp.MustCompile(`^label_values\((.+),\s*(\w+)\)$`)

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

// allPanels returns the dashboard's panels, a collapsed row's included.
func (d dashboard) allPanels() []panel {
	var out []panel
	for _, p := range d.Panels {
		out = append(out, p)
		out = append(out, p.Panels...)
	}
	return out
}

// queries returns every expression of the dashboard's panels and the selectors of
// its label_values variables, and the label each of those variables lists.
func (d dashboard) queries(t *testing.T) (qs []query, varLabels map[string]string) {
	t.Helper()
	for _, p := range d.allPanels() {
		for _, tg := range p.Targets {
			qs = append(qs, query{fmt.Sprintf("panel %q target %s", p.Title, tg.RefID), tg.Expr})
		}
	}
	varLabels = map[string]string{}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("variable %s: query: %v", v.Name, err)
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			t.Fatalf("variable %s: query %q, want label_values(SELECTOR, LABEL)", v.Name, q.Query)
		}
		where := fmt.Sprintf("variable %s", v.Name)
		qs = append(qs, query{where, m[1]})
		varLabels[where] = m[2]
	}
	return qs, varLabels
}

// TestDashboard checks the dashboard's shape: Grafana's dashboard schema, strictly
// (grafana-foundation-sdk: no unknown field, no required one missing, panel options
// by panel type), unique panel ids, panels inside the 24-column grid and not
// overlapping, every panel on the datasource variable with at least one query, and
// every query parsing as PromQL.
func TestDashboard(t *testing.T) {
	b, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	plugins.RegisterDefaultPlugins()
	var schema grafana.Dashboard
	if err := schema.UnmarshalJSONStrict(b); err != nil {
		// UnmarshalJSONStrict returns its (empty) list of errors even when there are none.
		if be, ok := errors.AsType[cog.BuildErrors](err); !ok || len(be) > 0 {
			t.Errorf("%s does not follow Grafana's dashboard schema:\n%v", dashboardPath, err)
		}
	}
	if err := schema.Validate(); err != nil {
		t.Errorf("%s: %v", dashboardPath, err)
	}
	d := readDashboard(t)
	if d.UID == "" || d.Title == "" {
		t.Errorf("dashboard uid %q, title %q: want both set", d.UID, d.Title)
	}
	ids := map[int]string{}
	var placed []panel
	for _, p := range d.allPanels() {
		if other, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		g := p.GridPos
		if g.W <= 0 || g.H <= 0 || g.X < 0 || g.X+g.W > 24 {
			t.Errorf("panel %q: gridPos %+v, want inside 24 columns", p.Title, g)
		}
		for _, o := range placed {
			h := o.GridPos
			if g.X < h.X+h.W && h.X < g.X+g.W && g.Y < h.Y+h.H && h.Y < g.Y+g.H {
				t.Errorf("panels %q %+v and %q %+v overlap", o.Title, h, p.Title, g)
			}
		}
		placed = append(placed, p)
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %+v, want uid ${datasource}", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no queries", p.Title)
		}
	}
	qs, _ := d.queries(t)
	for _, q := range qs {
		if _, err := parseQuery(q.expr); err != nil {
			t.Errorf("%s: parse %q: %v", q.where, q.expr, err)
		}
	}
}

// TestServedMetrics runs the decision service (see scrapeService) and checks every
// query of the dashboard and every rule's expression against its /metrics (see
// checkServed), each variable's label against its selector's series, and that
// every tollgate_ metric it serves has a panel.
func TestServedMetrics(t *testing.T) {
	s, err := served()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range s.notes {
		t.Log(n)
	}
	fams := s.fams
	qs, varLabels := readDashboard(t).queries(t)
	onDashboard := map[string]bool{}
	for _, q := range qs {
		used := checkQuery(t, q, fams)
		if strings.HasPrefix(q.where, "panel ") {
			maps.Copy(onDashboard, used)
		}
		if l, ok := varLabels[q.where]; ok {
			for name := range used {
				if _, has := fams[name].labels[l]; !has && !targetLabels[l] {
					t.Errorf("%s: lists label %s, which %s does not have", q.where, l, name)
				}
			}
		}
	}
	for _, q := range ruleQueries(t) {
		checkQuery(t, q, fams)
	}
	for _, name := range slices.Sorted(maps.Keys(fams)) {
		if strings.HasPrefix(name, "tollgate_") && !onDashboard[name] {
			t.Errorf("/metrics serves %s, but no panel of %s shows it", name, dashboardPath)
		}
	}
}

// checkQuery parses q and reports checkServed's problems; it returns the families
// q uses.
func checkQuery(t *testing.T, q query, fams map[string]family) map[string]bool {
	t.Helper()
	expr, err := parseQuery(q.expr)
	if err != nil {
		t.Errorf("%s: parse %q: %v", q.where, q.expr, err)
		return nil
	}
	problems, used := checkServed(expr, fams)
	for _, p := range problems {
		t.Errorf("%s: %s", q.where, p)
	}
	return used
}

// TestDashboardShowsData evaluates every panel's query, as Grafana would send it
// (variables All, $__rate_interval 5m), on two scrapes of the running service 30s
// apart (see scrapeService), and requires each to return something: a query can
// name only served series and still select nothing, by a matcher, a vector
// match or a division no series meets.
func TestDashboardShowsData(t *testing.T) {
	s, err := served()
	if err != nil {
		t.Fatal(err)
	}
	storage := promqltest.LoadedStorage(t, s.load)
	engine := promqltest.NewTestEngine(t, false, 0, 1e6)
	qs, _ := readDashboard(t).queries(t)
	for _, q := range qs {
		if !strings.HasPrefix(q.where, "panel ") {
			continue
		}
		expr := templateVar.ReplaceAllString(intervalVar.ReplaceAllString(q.expr, "5m"), ".*")
		query, err := engine.NewInstantQuery(context.Background(), storage, nil, expr, time.Unix(30, 0))
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		res := query.Exec(context.Background())
		switch v := res.Value.(type) {
		case nil:
			t.Errorf("%s: %s: %v", q.where, expr, res.Err)
		case promql.Vector:
			if len(v) == 0 {
				t.Errorf("%s: %s selects nothing on the service's series", q.where, expr)
			}
		}
		query.Close()
	}
}
