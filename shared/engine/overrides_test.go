package engine_test

import (
	"context"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestOverrideLiftsOneKey decides on a real redis-server, standalone and a 3-master
// cluster, with a default of 5 per hour per key, an override of 50 for one
// customer's key and an unlimited internal key: the customer gets 50 where every
// other key gets 5, the internal key is never limited, and the overridden default
// is never charged for the customer.
func TestOverrideLiftsOneKey(t *testing.T) {
	p, err := policy.Parse([]byte(`domain: d
rules:
  - {name: per-key, match: {api_key: "*"}, limits: [{algorithm: fixed_window, rate: 5/h}]}
  - {name: acme, match: {api_key: k-acme}, replaces: [per-key], limits: [{algorithm: fixed_window, rate: 50/h}]}
  - {name: internal, match: {api_key: k-internal}, unlimited: true, replaces: [per-key]}
`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		url     func(t *testing.T) string
		cluster bool
	}{
		{"standalone", func(t *testing.T) string { return "redis://" + redistest.StartServer(t).Addr }, false},
		{"cluster", func(t *testing.T) string { return redistest.StartCluster(t).URL() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			st, err := redisstore.Open(redisstore.Config{URL: tc.url(t), Cluster: tc.cluster})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			eng, err := engine.New(engine.Config{Policy: p, Store: st})
			if err != nil {
				t.Fatal(err)
			}
			admitted := func(key string, n int) int {
				got := 0
				for range n {
					v, err := eng.Check(context.Background(), engine.Request{Domain: "d", Attributes: map[string]string{"api_key": key}, Cost: 1})
					if err != nil {
						t.Fatal(err)
					}
					if v.Degraded {
						t.Fatalf("%s: the failure mode decided: %+v", key, v)
					}
					if v.Allowed {
						got++
					}
				}
				return got
			}
			for _, c := range []struct {
				key  string
				want int
			}{{"k-1", 5}, {"k-acme", 50}, {"k-2", 5}, {"k-internal", 100}} {
				if got := admitted(c.key, 100); got != c.want {
					t.Errorf("%s: %d of 100 admitted, want %d", c.key, got, c.want)
				}
			}
			// The default's count for the customer stayed untouched.
			plan, err := eng.Plan(engine.Request{Domain: "d", Attributes: map[string]string{"api_key": "k-acme"}})
			if err != nil {
				t.Fatal(err)
			}
			if len(plan.Rules) != 1 || plan.Rules[0].Name != "acme" {
				t.Fatalf("k-acme's plan = %d limits, want acme's alone", len(plan.Rules))
			}
			def, err := policy.Parse([]byte("domain: d\nrules: [{name: per-key, match: {api_key: \"*\"}, limits: [{algorithm: fixed_window, rate: 5/h}]}]\n"))
			if err != nil {
				t.Fatal(err)
			}
			probe, err := engine.New(engine.Config{Policy: def, Store: st})
			if err != nil {
				t.Fatal(err)
			}
			dp, err := probe.Plan(engine.Request{Domain: "d", Attributes: map[string]string{"api_key": "k-acme"}})
			if err != nil {
				t.Fatal(err)
			}
			v, err := probe.Peek(context.Background(), dp)
			if err != nil || v.Decision.Remaining != 5 {
				t.Errorf("per-key's remaining for k-acme = %d, %v, want 5: the replaced limit was charged", v.Decision.Remaining, err)
			}
		})
	}
}
