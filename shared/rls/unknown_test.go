package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// TestUnknownDomainCap sends more unknown domains than the service names in its
// metric (100): the first 100 keep their own series, and every later one is
// counted under "other" on every request, never under its own name, with one log
// line for all of them.
func TestUnknownDomainCap(t *testing.T) {
	t.Parallel()
	const named = 100
	var logs syncBuffer
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false)
	srv := rls.NewDomains(map[string]rls.Domain{"rl": {Engine: eng}}, slog.New(slog.NewTextHandler(&logs, nil)))
	reg := prometheus.NewRegistry()
	if err := srv.Register(reg); err != nil {
		t.Fatal(err)
	}
	c := serve(t, srv)
	ask := func(domain string) {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), request(domain, descriptor("key1", "x")))
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("domain %s: %v, %v; want OK", domain, resp, err)
		}
	}
	for i := range named {
		ask(fmt.Sprintf("d%d", i))
	}
	for _, d := range []string{"d100", "d100", "d101", "d0", "d100"} {
		ask(d)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
		}
	}
	want := map[string]float64{"d0": 2, "other": 4}
	for i := 1; i < named; i++ {
		want[fmt.Sprintf("d%d", i)] = 1
	}
	if len(counts) != len(want) {
		t.Errorf("%d series, want %d (%d domains and other); d100 = %v, d101 = %v", len(counts), len(want), named, counts["d100"], counts["d101"])
	}
	for d, n := range want {
		if counts[d] != n {
			t.Errorf("requests for %s = %v, want %v", d, counts[d], n)
		}
	}
	if n := strings.Count(logs.String(), "domain no configuration defines"); n != named {
		t.Errorf("logged %d domains by name, want %d", n, named)
	}
	if n := strings.Count(logs.String(), "more unknown domains"); n != 1 {
		t.Errorf("logged the overflow %d times, want once", n)
	}
}
