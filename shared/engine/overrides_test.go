package engine_test

import (
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// redisEngine returns an engine for the policy doc on the Redis at url (a cluster's
// when cluster is set), closed with the test.
func redisEngine(t *testing.T, doc []byte, url string, cluster bool) *engine.Engine {
	t.Helper()
	p, err := policy.Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	if p.Failure.Timeout == policy.DefaultTimeout {
		// A loaded machine must not turn answers into the failure mode's: these tests
		// check what the store decides, not the timeout.
		p.Failure.Timeout = 5 * time.Second
	}
	st, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// TestOverrideLiftsOneKey decides on a real redis-server, standalone and a 3-master
// cluster, with a default of 5 per hour per key, an override of 50 for one
// customer's key and an unlimited internal key: the customer gets 50 where every
// other key gets 5, the internal key is never limited, and the overridden default
// is never charged for the customer.
func TestOverrideLiftsOneKey(t *testing.T) {
	p, err := policy.Parse([]byte(`domain: d
failure: {timeout: 2s} # a loaded machine must not turn answers into the failure mode's
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
			st, err := redisstore.Open(redisstore.Config{URL: tc.url(t), Cluster: tc.cluster, Timeout: time.Second})
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
			if len(plan.Items) != 1 || plan.Items[0].Rule.Name != "acme" {
				t.Fatalf("k-acme's plan = %d limits, want acme's alone", len(plan.Items))
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

// TestTemplateKeysStayBounded decides requests for a hundred concrete paths of one
// route template and two methods of a list on a real redis-server: they share one
// limit per key, and Redis holds one key per rule and client, not one per path.
func TestTemplateKeysStayBounded(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	eng := redisEngine(t, []byte(`domain: d
failure: {timeout: 2s} # a loaded machine must not turn answers into the failure mode's
rules:
  - {name: orders, match: {api_key: "*", path: "/users/{id}/orders"}, limits: [{algorithm: fixed_window, rate: 5/h}]}
  - {name: writes, match: {api_key: "*", method: [POST, PUT]}, limits: [{algorithm: fixed_window, rate: 3/h}]}
  - {name: not-admin, match: {api_key: "*", path: "!/admin/*", ua: "~^curl/"}, limits: [{algorithm: fixed_window, rate: 2/h}]}
`), "redis://"+srv.Addr, false)
	admitted := func(attrs func(i int) map[string]string) int {
		n := 0
		for i := range 100 {
			v, err := eng.Check(context.Background(), engine.Request{Domain: "d", Attributes: attrs(i), Cost: 1})
			if err != nil || v.Degraded {
				t.Fatalf("Check = %+v, %v", v, err)
			}
			if v.Allowed {
				n++
			}
		}
		return n
	}
	orders := admitted(func(i int) map[string]string {
		return map[string]string{"api_key": "k1", "path": fmt.Sprintf("/users/%d/orders", i)}
	})
	writes := admitted(func(i int) map[string]string {
		return map[string]string{"api_key": "k1", "method": []string{"POST", "PUT"}[i%2], "path": "/x"}
	})
	curl := admitted(func(i int) map[string]string {
		return map[string]string{"api_key": "k1", "path": fmt.Sprintf("/items/%d", i), "ua": "curl/8." + fmt.Sprint(i)}
	})
	if orders != 5 || writes != 3 || curl != 2 {
		t.Errorf("admitted of 100: orders %d, writes %d, curl off /admin %d; want 5, 3 and 2 (one limit each)", orders, writes, curl)
	}
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 3 {
		t.Errorf("Redis keys after 300 requests over 200 distinct paths = %d (%q), want 3: one per rule", len(keys), keys)
	}
}

// TestPlans chooses limits by plan on a real redis-server: from the policy's table of
// keys (one by its SHA-256, one as it is), with a default plan for other keys, and
// never from a plan the request claims for itself.
func TestPlans(t *testing.T) {
	t.Parallel()
	sum := sha256.Sum256([]byte("k-pro-secret"))
	eng := redisEngine(t, fmt.Appendf(nil, `domain: d
plans:
  default: free
  keys:
    "sha256:%x": pro
    k-team: team
rules:
  - {name: free, match: {api_key: "*", plan: free}, limits: [{algorithm: fixed_window, rate: 2/h}]}
  - {name: pro, match: {api_key: "*", plan: pro}, limits: [{algorithm: fixed_window, rate: 20/h}]}
  - {name: team, match: {api_key: "*", plan: team}, limits: [{algorithm: fixed_window, rate: 7/h}]}
`, sum), "redis://"+redistest.StartServer(t).Addr, false)
	for _, c := range []struct {
		attrs map[string]string
		rule  string
		want  int
	}{
		{map[string]string{"api_key": "k-pro-secret"}, "pro", 20},
		{map[string]string{"api_key": algo.HashValue("k-pro-secret-2")}, "free", 2}, // hashed by a front door, not in the table
		{map[string]string{"api_key": "k-team"}, "team", 7},
		{map[string]string{"api_key": "k-nobody", "plan": "pro"}, "free", 2}, // a claimed plan does not count
	} {
		n := 0
		for range 50 {
			v, err := eng.Check(context.Background(), engine.Request{Domain: "d", Attributes: c.attrs, Cost: 1})
			if err != nil || v.Degraded {
				t.Fatalf("Check(%v) = %+v, %v", c.attrs, v, err)
			}
			if v.Rule != c.rule {
				t.Fatalf("Check(%v) decided by %q, want %q", c.attrs, v.Rule, c.rule)
			}
			if v.Allowed {
				n++
			}
		}
		if n != c.want {
			t.Errorf("%v: %d of 50 admitted, want %d", c.attrs, n, c.want)
		}
	}
	if hashed := eng.Policy().Plans.Plan(algo.HashValue("k-pro-secret"), true); hashed != "pro" {
		t.Errorf("Plan(a front door's hash of the pro key) = %q, want pro", hashed)
	}
	// The table's hash is no secret: a client that sends it, in either form, as its
	// key gets the default plan.
	for _, spoof := range []string{fmt.Sprintf("sha256:%x", sum), algo.HashValue("k-pro-secret")} {
		p, err := eng.Plan(engine.Request{Domain: "d", Attributes: map[string]string{"api_key": spoof}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Attributes["plan"]; got != "free" {
			t.Errorf("a client sending the table's hash %q as its key: plan %q, want free", spoof, got)
		}
	}
	p, err := eng.Plan(engine.Request{Domain: "d", Attributes: map[string]string{"api_key": algo.HashValue("k-pro-secret")}, Cost: 1, KeyHashed: true})
	if err != nil || p.Attributes["plan"] != "pro" {
		t.Errorf("the hash a front door made (KeyHashed): plan %q, %v; want pro", p.Attributes["plan"], err)
	}
}

// TestPlanFromHeader chooses limits by a plan header an upstream authenticator sets
// (the policy has no table, so the header's value is used as it is).
func TestPlanFromHeader(t *testing.T) {
	t.Parallel()
	eng := redisEngine(t, []byte(`domain: d
rules:
  - {name: free, match: {api_key: "*", x-plan: free}, limits: [{algorithm: fixed_window, rate: 2/h}]}
  - {name: pro, match: {api_key: "*", x-plan: pro}, limits: [{algorithm: fixed_window, rate: 9/h}]}
`), "redis://"+redistest.StartServer(t).Addr, false)
	for plan, want := range map[string]int{"free": 2, "pro": 9} {
		n := 0
		for range 20 {
			v, err := eng.Check(context.Background(), engine.Request{Domain: "d", Attributes: map[string]string{"api_key": "k-" + plan, "x-plan": plan}, Cost: 1})
			if err != nil || v.Degraded {
				t.Fatal(v, err)
			}
			if v.Allowed {
				n++
			}
		}
		if n != want {
			t.Errorf("x-plan %s: %d of 20 admitted, want %d", plan, n, want)
		}
	}
}
