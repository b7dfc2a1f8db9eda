package deploy_test

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// family is what one metric family of a scrape offers queries: its type, and the
// values each of its labels took.
type family struct {
	typ    dto.MetricType
	labels map[string]map[string]bool
}

// testPolicy is the served policy: one per-key limit of 2 a minute, so the third
// request of a key is denied and the fourth comes from the deny cache; failure mode
// closed, so decisions while Redis is down are "unavailable"; a breaker that opens
// after 2 failures.
const testPolicy = `domain: d
failure:
  mode: closed
  timeout: 50ms
  breaker: {failures: 2, open_for: 1h}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits: [{algorithm: fixed_window, rate: 2/min}]
`

// goTool is the go command of the toolchain running the test.
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

// scrape is what scrapeService saw.
type scrape struct {
	fams  map[string]family // by name, as /metrics's # TYPE lines name them
	notes []string          // series the drive waited for in vain
	// load is two scrapes 30s apart as a promqltest load command.
	load string
}

// served runs the decision service once for the whole test binary and returns what
// its /metrics served; see scrapeService.
var served = sync.OnceValues(scrapeService)

// scrapeService builds lambda/limiter from the module above, runs it on a
// miniredis of this process with testPolicy in a file it polls every 100ms, and
// drives it until every labelled series the artefacts may name exists: allowed,
// denied and unavailable decisions of rule per-key, a deny cache hit, reloads that
// are applied, invalid and error, and, after Redis is closed, the closed failure
// mode and an open breaker. It returns the families of the last GET /metrics and
// the last two scrapes, 30s apart as far as the tests' queries can tell.
func scrapeService() (s scrape, err error) {
	dir, err := os.MkdirTemp("", "tollgate-deploy-")
	if err != nil {
		return s, err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "limiter")
	build := exec.Command(goTool(), "build", "-o", bin, "./lambda/limiter")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		return s, fmt.Errorf("go build ./lambda/limiter: %v\n%s", err, out)
	}

	mr := miniredis.NewMiniRedis()
	if err := mr.StartAddr("127.0.0.1:0"); err != nil {
		return s, fmt.Errorf("start miniredis: %w", err)
	}
	defer mr.Close()
	redisAddr := mr.Addr()
	policy := filepath.Join(dir, "policy.yaml")
	if err := os.WriteFile(policy, []byte(testPolicy), 0o600); err != nil {
		return s, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return s, err
	}
	addr := ln.Addr().String()
	ln.Close()

	var logs bytes.Buffer
	cmd := exec.Command(bin)
	// The service reads its configuration from the environment: none of the
	// caller's may reach it.
	cmd.Env = slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return slices.ContainsFunc([]string{"TOLLGATE_", "REDIS_", "AWS_", "LIMIT_"}, func(p string) bool { return strings.HasPrefix(kv, p) })
	})
	cmd.Env = append(cmd.Env,
		"TOLLGATE_POLICY="+policy, "REDIS_URL=redis://"+redisAddr, "TOLLGATE_LISTEN="+addr,
		"TOLLGATE_POLICY_POLL=100ms")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		return s, err
	}
	defer func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w\nservice log:\n%s", err, logs.String())
		}
	}()

	base := "http://" + addr
	client := &http.Client{Timeout: 5 * time.Second}
	get := func(path string) (int, string, error) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	check := func(key string) (int, error) {
		resp, err := client.Post(base+"/v1/check", "application/json",
			strings.NewReader(`{"domain":"d","attributes":{"api_key":"`+key+`"}}`))
		if err != nil {
			return 0, err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// waitFor polls /metrics for up to 10s until it holds the line want, doing each
	// round. When it never does, it notes so and returns: the checks of the
	// artefacts then say which series is missing, and the note says why.
	waitFor := func(want string, each func() error) error {
		deadline := time.Now().Add(10 * time.Second)
		for {
			if each != nil {
				if err := each(); err != nil {
					return err
				}
			}
			if _, body, err := get("/metrics"); err == nil && strings.Contains(body, "\n"+want) {
				return nil
			}
			if time.Now().After(deadline) {
				s.notes = append(s.notes, "GET /metrics never showed "+want)
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if code, _, err := get("/readyz"); err == nil && code == http.StatusOK {
			break
		}
		if time.Now().After(deadline) {
			return s, fmt.Errorf("%s/readyz never answered 200", base)
		}
	}

	for i, want := range []int{200, 200, 429, 429} {
		code, err := check("k")
		if err != nil {
			return s, err
		}
		if code != want {
			return s, fmt.Errorf("request %d of key k: status %d, want %d", i+1, code, want)
		}
	}
	if err := waitFor("tollgate_deny_cache_hits_total 1", nil); err != nil {
		return s, err
	}

	for _, step := range []struct {
		change func() error
		want   string
	}{
		{func() error { return os.WriteFile(policy, []byte(testPolicy+"    shadow: true\n"), 0o600) }, `tollgate_policy_reloads_total{result="applied"} 1`},
		{func() error { return os.WriteFile(policy, []byte("domain: d\nrules: nonsense\n"), 0o600) }, `tollgate_policy_reloads_total{result="invalid"}`},
		{func() error { return os.Remove(policy) }, `tollgate_policy_reloads_total{result="error"}`},
	} {
		if err := step.change(); err != nil {
			return s, err
		}
		if err := waitFor(step.want, nil); err != nil {
			return s, err
		}
	}

	mr.Close()
	n := 0
	next := func() error {
		n++
		_, err := check(fmt.Sprintf("down-%d", n))
		return err
	}
	for _, want := range []string{
		`tollgate_decisions_total{domain="d",result="unavailable",`,
		`tollgate_failure_mode_activations_total{mode="closed"}`,
		`tollgate_breaker_state{node="` + redisAddr + `",state="open"} 1`,
	} {
		if err := waitFor(want, next); err != nil {
			return s, err
		}
	}

	// Two scrapes, with decisions between them, so that rates have two samples.
	var scrapes [2]map[string]*dto.MetricFamily
	for i := range scrapes {
		if i > 0 {
			for range 3 {
				if err := next(); err != nil {
					return s, err
				}
			}
		}
		code, body, err := get("/metrics")
		if err != nil || code != http.StatusOK {
			return s, fmt.Errorf("GET /metrics: %d, %v", code, err)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if scrapes[i], err = parser.TextToMetricFamilies(strings.NewReader(body)); err != nil {
			return s, fmt.Errorf("parse /metrics: %w", err)
		}
	}
	s.fams = map[string]family{}
	for name, mf := range scrapes[1] {
		f := family{typ: mf.GetType(), labels: map[string]map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if f.labels[lp.GetName()] == nil {
					f.labels[lp.GetName()] = map[string]bool{}
				}
				f.labels[lp.GetName()][lp.GetValue()] = true
			}
		}
		s.fams[name] = f
	}
	s.load = loadCommand(scrapes)
	return s, nil
}

// loadCommand writes two scrapes as a promqltest load command, the first at 0s and
// the second at 30s (_ where a series is missing from one).
func loadCommand(scrapes [2]map[string]*dto.MetricFamily) string {
	values := map[string]*[2]string{}
	add := func(i int, name string, m *dto.Metric, extra map[string]string, v float64) {
		ls := map[string]string{"__name__": name}
		for _, lp := range m.GetLabel() {
			ls[lp.GetName()] = lp.GetValue()
		}
		maps.Copy(ls, extra)
		var b strings.Builder
		b.WriteString("{")
		for j, k := range slices.Sorted(maps.Keys(ls)) {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "%s=%q", k, ls[k])
		}
		b.WriteString("}")
		key := b.String()
		if values[key] == nil {
			values[key] = &[2]string{"_", "_"}
		}
		values[key][i] = strconv.FormatFloat(v, 'g', -1, 64)
	}
	for i, mfs := range scrapes {
		for name, mf := range mfs {
			for _, m := range mf.GetMetric() {
				switch mf.GetType() {
				case dto.MetricType_COUNTER:
					add(i, name, m, nil, m.GetCounter().GetValue())
				case dto.MetricType_GAUGE:
					add(i, name, m, nil, m.GetGauge().GetValue())
				case dto.MetricType_UNTYPED:
					add(i, name, m, nil, m.GetUntyped().GetValue())
				case dto.MetricType_HISTOGRAM:
					h := m.GetHistogram()
					for _, bk := range h.GetBucket() {
						add(i, name+"_bucket", m, map[string]string{"le": strconv.FormatFloat(bk.GetUpperBound(), 'g', -1, 64)}, float64(bk.GetCumulativeCount()))
					}
					add(i, name+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
					add(i, name+"_sum", m, nil, h.GetSampleSum())
					add(i, name+"_count", m, nil, float64(h.GetSampleCount()))
				case dto.MetricType_SUMMARY:
					sm := m.GetSummary()
					for _, q := range sm.GetQuantile() {
						add(i, name, m, map[string]string{"quantile": strconv.FormatFloat(q.GetQuantile(), 'g', -1, 64)}, q.GetValue())
					}
					add(i, name+"_sum", m, nil, sm.GetSampleSum())
					add(i, name+"_count", m, nil, float64(sm.GetSampleCount()))
				}
			}
		}
	}
	var b strings.Builder
	b.WriteString("load 30s\n")
	for _, k := range slices.Sorted(maps.Keys(values)) {
		fmt.Fprintf(&b, "  %s %s %s\n", k, values[k][0], values[k][1])
	}
	return b.String()
}
