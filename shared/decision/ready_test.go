package decision_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

const readyPolicy = `
domain: test
failure: {mode: closed, timeout: 500ms, breaker: {failures: 2, open_for: 1s}}
rules:
  - {name: per-key, match: {api_key: "*"}, limits: [{algorithm: fixed_window, rate: 1000/h}]}
`

// readyService serves the decision handler on a store of url, as the decision service
// wires it, and returns its address and its engine.
func readyService(t *testing.T, url string, cluster bool) (string, *engine.Engine) {
	t.Helper()
	p, err := policy.Parse([]byte(readyPolicy))
	if err != nil {
		t.Fatal(err)
	}
	store, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, BatchWait: redisstore.DefaultBatchWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	reg := prometheus.NewRegistry()
	m := decision.NewMetrics(reg)
	eng, err := engine.New(engine.Config{Policy: p, Store: store, Hooks: m.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(decision.NewHandler(eng, decision.Options{Registry: reg}))
	t.Cleanup(hs.Close)
	return hs.URL, eng
}

// getReady returns /readyz's status and body.
func getReady(t *testing.T, url string) (int, decision.ReadyResponse) {
	t.Helper()
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var rr decision.ReadyResponse
	if err := json.Unmarshal(raw, &rr); err != nil {
		t.Fatalf("GET /readyz body %s: %v", raw, err)
	}
	return resp.StatusCode, rr
}

// tripBreaker sends checks for api_key until the engine reports an open breaker.
func tripBreaker(t *testing.T, url string, eng *engine.Engine, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for i := 0; eng.BreakerState() != "open"; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("breaker still %s after 5s of checks on a dead node", eng.BreakerState())
		}
		check(t, url, keys[i%len(keys)], "/")
	}
}

func TestReadyzFollowsTheBreaker(t *testing.T) {
	srv := redistest.StartServer(t)
	url, eng := readyService(t, srv.URL(), false)
	if code, rr := getReady(t, url); code != http.StatusOK || rr.Status != "ready" || len(rr.Nodes) != 1 || rr.Nodes[0].Breaker != "closed" {
		t.Fatalf("GET /readyz with Redis up = %d %+v, want 200 ready with one closed node", code, rr)
	}
	srv.Kill()
	tripBreaker(t, url, eng, "k")
	code, rr := getReady(t, url)
	if code != http.StatusServiceUnavailable || rr.Status != "not ready" || rr.Breaker != "open" {
		t.Errorf("GET /readyz with the breaker open = %d %+v, want 503 not ready, breaker open", code, rr)
	}
	if len(rr.Nodes) != 1 || rr.Nodes[0].Node != srv.Addr || rr.Nodes[0].Breaker != "open" || rr.Nodes[0].Error == "" {
		t.Errorf("GET /readyz nodes = %+v, want %s open with an error", rr.Nodes, srv.Addr)
	}
	if a := check(t, url, "k", "/"); a.status != http.StatusServiceUnavailable {
		t.Errorf("check with the breaker open = %d, want 503", a.status)
	}
	metrics := scrape(t, url)
	if want := `tollgate_breaker_state{node="` + srv.Addr + `",state="open"} 1`; !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %q:\n%s", want, grep(metrics, "tollgate_breaker_state"))
	}

	// With no request at all, /readyz's own check probes the breaker: an instance a
	// load balancer took out of service comes back. Once the longest wait (open_for)
	// is over, the very first /readyz is that probe and answers 200: nothing else may
	// take the probe from it.
	srv.Restart(t)
	time.Sleep(1200 * time.Millisecond) // open_for 1s caps the breaker's wait
	code, rr = getReady(t, url)
	if code != http.StatusOK {
		t.Fatalf("first GET /readyz after Redis came back and the breaker's wait ended = %d %+v, want 200", code, rr)
	}
	if rr.Status != "ready" || rr.Breaker != "closed" || rr.Nodes[0].Breaker != "closed" {
		t.Errorf("GET /readyz after recovery = %+v, want ready with a closed breaker", rr)
	}
	if a := check(t, url, "k", "/"); a.status != http.StatusOK {
		t.Errorf("check after recovery = %d %s, want 200", a.status, a.raw)
	}
}

func TestReadyzDegradedWithOneDeadShard(t *testing.T) {
	cl := redistest.StartCluster(t)
	for _, n := range cl.Nodes() {
		n.Do(t, "CONFIG", "SET", "cluster-require-full-coverage", "no")
	}
	url, eng := readyService(t, cl.URL(), true)
	if code, rr := getReady(t, url); code != http.StatusOK || rr.Status != "ready" || len(rr.Nodes) != 3 {
		t.Fatalf("GET /readyz with the cluster up = %d %+v, want 200 ready with 3 nodes", code, rr)
	}
	victim := cl.Nodes()[1]
	victim.Kill()
	keys := make([]string, 30) // some on each master
	for i := range keys {
		keys[i] = "key" + strings.Repeat("x", i)
	}
	tripBreaker(t, url, eng, keys...)
	code, rr := getReady(t, url)
	if code != http.StatusOK || rr.Status != "degraded" {
		t.Errorf("GET /readyz with one master dead = %d %+v, want 200 degraded", code, rr)
	}
	open := 0
	for _, n := range rr.Nodes {
		if n.Breaker == "open" {
			open++
			if n.Node != victim.Addr {
				t.Errorf("node %s open, want only the killed %s", n.Node, victim.Addr)
			}
		}
	}
	if open != 1 || len(rr.Nodes) != 3 {
		t.Errorf("GET /readyz nodes = %+v, want 3 with the killed one open", rr.Nodes)
	}
}

// scrape returns the service's metrics.
func scrape(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// grep returns the lines of s that contain sub.
func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
