package decision_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/decision"
)

// breakerSeries returns the tollgate_breaker_state series of reg as "node state value".
func breakerSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_breaker_state" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			out = append(out, fmt.Sprintf("%s %s %v", labels["node"], labels["state"], m.GetGauge().GetValue()))
		}
	}
	slices.Sort(out)
	return out
}

func TestBreakerStateSeriesPerNode(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := decision.NewMetrics(reg).Hooks()
	h.BreakerState("a:6379", "closed")
	h.BreakerState("b:6379", "closed")
	h.BreakerState("a:6379", "open")
	want := []string{
		"a:6379 closed 0", "a:6379 half-open 0", "a:6379 open 1",
		"b:6379 closed 1", "b:6379 half-open 0", "b:6379 open 0",
	}
	if got := breakerSeries(t, reg); !slices.Equal(got, want) {
		t.Errorf("breaker series = %q, want %q", got, want)
	}
	// A node gone from the topology takes its series with it.
	h.BreakerState("a:6379", "")
	if got, want := breakerSeries(t, reg), want[3:]; !slices.Equal(got, want) {
		t.Errorf("breaker series after a:6379 left = %q, want %q", got, want)
	}
}
