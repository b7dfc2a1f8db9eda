package decision_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestBlankForwardedForKeepsClientsApart sends ten clients whose X-Forwarded-For ends
// in a blank entry ("203.0.113.5, ") behind one trusted proxy. Each must be limited by
// its own remote_address — one request each is allowed, the second denied — and not
// share the one empty identity a blank entry used to give; every fallback is counted.
func TestBlankForwardedForKeepsClientsApart(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte(`
domain: test
identity: {trusted_proxies: 1}
rules:
  - {name: per-ip, match: {remote_address: "*"}, limits: [{algorithm: fixed_window, rate: 1/min}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := decision.NewMetrics(reg)
	eng, err := engine.New(engine.Config{Policy: p, Hooks: m.Hooks()}) // in process: the identity is the point here
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(decision.NewHandler(eng, decision.Options{Registry: reg}))
	t.Cleanup(hs.Close)

	tests := []struct {
		name string
		xff  string
	}{
		{"blank last entry", "203.0.113.5, "},
		{"whitespace last entry", "203.0.113.5,  "},
		{"garbage last entry", "203.0.113.5, unknown"},
	}
	for round, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for i := range 10 {
				body := fmt.Sprintf(`{"domain":"test","attributes":{"remote_address":"192.0.2.%d:4000","x-forwarded-for":%q}}`, 10*round+i, tt.xff)
				first := post(t, hs.URL, "/v1/check", body)
				second := post(t, hs.URL, "/v1/check", body)
				if first.status != http.StatusOK || second.status != http.StatusTooManyRequests {
					t.Errorf("client %d: Check(%s) twice = %d, %d, want 200, 429 (its own limit of 1/min)", i, body, first.status, second.status)
				}
			}
			// Every request so far fell back: two per client, ten clients a round.
			if got, want := counter(t, hs.URL, "tollgate_identity_fallbacks_total"), fmt.Sprint(20*(round+1)); got != want {
				t.Errorf("tollgate_identity_fallbacks_total = %s, want %s", got, want)
			}
		})
	}
}

// counter returns the value of a metric without labels as /metrics writes it.
func counter(t *testing.T, url, name string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			return v
		}
	}
	t.Fatalf("GET /metrics has no %s", name)
	return ""
}
