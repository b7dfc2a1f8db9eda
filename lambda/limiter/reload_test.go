package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// reloadPolicy is the test's policy: a per-key limit the load runs against, a
// per-user counter whose state must survive reloads, and extra rules that a version
// adds.
func reloadPolicy(extra string) string {
	return `domain: d
rules:
  - name: load
    match: {api_key: "*"}
    limits: [{algorithm: fixed_window, rate: 1000000/min}]
  - name: counted
    match: {user: "*"}
    limits: [{algorithm: fixed_window, rate: 10/min}]
` + extra
}

// TestReloadUnderLoad runs the service (run, as main does) on a real redis-server
// with a policy file and reloads it on SIGHUP while four clients keep deciding: a
// valid change applies, keeps the state of the limits it did not change, and shows in
// tollgate_policy_info; an invalid file is refused, counted, and the running policy
// keeps serving. No request fails across the reloads.
func TestReloadUnderLoad(t *testing.T) {
	srv := redistest.StartServer(t)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(reloadPolicy(""))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, env(map[string]string{
			"TOLLGATE_POLICY": path, "REDIS_URL": "redis://" + srv.Addr, "TOLLGATE_LISTEN": addr,
			"TOLLGATE_POLICY_POLL": "0", // SIGHUP only, so that each reload is the test's
		}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run() = %v", err)
		}
	}()
	base := "http://" + addr
	waitReady(t, base)

	type answer struct {
		Remaining int64 `json:"remaining"`
		Limits    []struct {
			Rule string `json:"rule"`
		} `json:"limits"`
	}
	check := func(attrs string) (int, answer) {
		t.Helper()
		resp, err := http.Post(base+"/v1/check", "application/json", strings.NewReader(`{"domain":"d","attributes":`+attrs+`}`))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var a answer
		if err := json.NewDecoder(resp.Body).Decode(&a); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, a
	}
	for range 5 {
		check(`{"user":"u"}`)
	}

	var sent, failed atomic.Int64
	var firstFailure atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := &http.Client{Timeout: 5 * time.Second}
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				body := fmt.Sprintf(`{"domain":"d","attributes":{"api_key":"k%d-%d"}}`, w, i%50)
				resp, err := c.Post(base+"/v1/check", "application/json", strings.NewReader(body))
				sent.Add(1)
				if err != nil {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, resp.Status)
				}
			}
		}()
	}

	firstSum := policySum(t, base)
	hup := func() {
		t.Helper()
		if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
			t.Fatal(err)
		}
	}
	// A valid change: a new rule. The counted limit is unchanged, so its key and its
	// five requests stay.
	write(reloadPolicy(`  - name: extra
    match: {user: "*"}
    limits: [{algorithm: gcra, rate: 100/s}]
`))
	hup()
	waitMetric(t, base, `tollgate_policy_reloads_total{result="applied"} 1`)
	status, a := check(`{"user":"u"}`)
	if status != http.StatusOK || len(a.Limits) != 2 {
		t.Fatalf("after the reload: %d with limits %+v, want 200 from counted and extra", status, a.Limits)
	}
	for _, l := range a.Limits {
		if l.Rule == "counted" && a.Remaining > 4 {
			t.Errorf("counted remaining = %d after 6 requests across the reload, want at most 4: its state was lost", a.Remaining)
		}
	}
	if sum := policySum(t, base); sum == firstSum || sum == "" {
		t.Errorf("tollgate_policy_info sha256 = %q after the reload, want a new one (was %q)", sum, firstSum)
	}
	// An invalid file: refused and counted, the running policy (with extra) stays.
	write(reloadPolicy("  - name: broken\n    limits: [{algorithm: gcra, rate: 10/x}]\n"))
	hup()
	waitMetric(t, base, `tollgate_policy_reloads_total{result="invalid"} 1`)
	if status, a := check(`{"user":"v"}`); status != http.StatusOK || len(a.Limits) != 2 {
		t.Errorf("after the refused reload: %d with limits %+v, want the running policy's two limits", status, a.Limits)
	}
	time.Sleep(100 * time.Millisecond)
	close(stop)
	wg.Wait()
	if n := failed.Load(); n > 0 || sent.Load() < 20 {
		t.Errorf("%d of %d requests failed across the reloads (first: %v), want none of at least 20", n, sent.Load(), firstFailure.Load())
	}
	t.Logf("%d requests across two reloads, %d failed", sent.Load(), failed.Load())
}

func waitReady(t *testing.T, base string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if resp, err := http.Get(base + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
	}
	t.Fatal("the service did not answer /healthz within 10s")
}

func metrics(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func waitMetric(t *testing.T, base, line string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if strings.Contains(metrics(t, base), line) {
			return
		}
	}
	t.Fatalf("no %q in /metrics within 5s", line)
}

// policySum returns the sha256 label of tollgate_policy_info.
func policySum(t *testing.T, base string) string {
	t.Helper()
	for _, l := range strings.Split(metrics(t, base), "\n") {
		if rest, ok := strings.CutPrefix(l, `tollgate_policy_info{sha256="`); ok {
			sum, _, _ := strings.Cut(rest, `"`)
			return sum
		}
	}
	return ""
}
