package reload_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

const (
	policyA = "domain: d\nrules:\n  - {name: r, match: {api_key: '*'}, limits: [{algorithm: gcra, rate: 10/s}]}\n"
	policyB = "domain: d\nrules:\n  - {name: r, match: {api_key: '*'}, limits: [{algorithm: gcra, rate: 20/s}]}\n"
	badDoc  = "domain: d\nrules:\n  - {name: r, limits: [{algorithm: gcra, rate: 10/x}]}\n"
)

// applied records the policies a Reloader applies and the results it reports.
type applied struct {
	mu       sync.Mutex
	policies []*policy.Policy
	results  []string
	running  []string
}

func (a *applied) config(src reload.Source, log *slog.Logger) reload.Config {
	return reload.Config{
		Source: src,
		Apply: func(p *policy.Policy) error {
			a.mu.Lock()
			defer a.mu.Unlock()
			a.policies = append(a.policies, p)
			return nil
		},
		Logger:   log,
		Reloaded: func(r string) { a.mu.Lock(); a.results = append(a.results, r); a.mu.Unlock() },
		Running:  func(s string) { a.mu.Lock(); a.running = append(a.running, s); a.mu.Unlock() },
	}
}

func rate(p *policy.Policy) string { return p.Rules[0].Limits[0].String() }

// TestFileReload walks a policy file through every result: unchanged, a valid change
// (applied), an invalid one and a missing file (both refused, the running policy
// stays), and back.
func TestFileReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	write := func(doc string) {
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(policyA)
	var logs bytes.Buffer
	var a applied
	r, p, err := reload.Load(context.Background(), a.config(reload.File(path), slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	if got := rate(p); !strings.Contains(got, "10/s") {
		t.Fatalf("first policy's limit = %s, want 10/s", got)
	}
	first := r.SHA256()
	steps := []struct {
		name    string
		change  func()
		want    string
		applied int    // policies applied so far
		errIn   string // in the error of a refused reload
	}{
		{"unchanged", func() {}, reload.Unchanged, 0, ""},
		{"valid change", func() { write(policyB) }, reload.Applied, 1, ""},
		{"invalid", func() { write(badDoc) }, reload.Invalid, 1, `rules[0].limits[0].rate: "10/x": unknown unit "x"`},
		{"the same invalid document, refused once", func() {}, reload.Unchanged, 1, ""},
		{"missing", func() { os.Remove(path) }, reload.Failed, 1, "no such file"},
		{"back to the first", func() { write(policyA) }, reload.Applied, 2, ""},
	}
	for _, s := range steps {
		s.change()
		got, err := r.Reload(context.Background())
		if got != s.want || len(a.policies) != s.applied {
			t.Fatalf("%s: Reload = %s, %v with %d applied; want %s with %d", s.name, got, err, len(a.policies), s.want, s.applied)
		}
		if s.errIn != "" && (err == nil || !strings.Contains(err.Error(), s.errIn)) {
			t.Errorf("%s: error %v, want it to contain %q", s.name, err, s.errIn)
		}
		if s.errIn != "" && !strings.Contains(logs.String(), "policy reload refused") {
			t.Errorf("%s: log %q, want the refusal logged", s.name, logs.String())
		}
	}
	if got := rate(a.policies[0]); !strings.Contains(got, "20/s") {
		t.Errorf("applied policy's limit = %s, want 20/s", got)
	}
	if r.SHA256() != first {
		t.Errorf("SHA256 after returning to the first document = %s, want %s", r.SHA256(), first)
	}
	want := []string{reload.Unchanged, reload.Applied, reload.Invalid, reload.Unchanged, reload.Failed, reload.Applied}
	if strings.Join(a.results, ",") != strings.Join(want, ",") {
		t.Errorf("results reported = %v, want %v", a.results, want)
	}
	if len(a.running) != 3 || a.running[0] != first || a.running[2] != first || a.running[1] == first {
		t.Errorf("running digests = %v, want the first, the second, the first", a.running)
	}
}

// TestLoadRefusesAnInvalidPolicy checks that the first load reports every problem with
// the source's name, and that an unreadable source is an error.
func TestLoadRefusesAnInvalidPolicy(t *testing.T) {
	t.Parallel()
	var a applied
	_, _, err := reload.Load(context.Background(), a.config(reload.Inline{Label: "TOLLGATE_POLICY_JSON", Doc: []byte(badDoc)}, nil))
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_POLICY_JSON") || !strings.Contains(err.Error(), "unknown unit") {
		t.Errorf("Load(invalid) = %v, want the source's name and the problem", err)
	}
	_, _, err = reload.Load(context.Background(), a.config(reload.File(filepath.Join(t.TempDir(), "none.yaml")), nil))
	if err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("Load(missing file) = %v, want an error naming the file", err)
	}
}

// TestWatch checks that Watch polls the file and that a signal reloads at once.
func TestWatch(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(policyA), 0o600); err != nil {
		t.Fatal(err)
	}
	var a applied
	r, _, err := reload.Load(context.Background(), a.config(reload.File(path), nil))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	now := make(chan os.Signal)
	done := make(chan struct{})
	go func() { r.Watch(ctx, 0, now); close(done) }() // no polling: only the signal
	if err := os.WriteFile(path, []byte(policyB), 0o600); err != nil {
		t.Fatal(err)
	}
	now <- syscall.SIGHUP
	waitApplied(t, &a, 1)
	cancel()
	<-done

	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go r.Watch(ctx, 10*time.Millisecond, nil)
	if err := os.WriteFile(path, []byte(policyA), 0o600); err != nil {
		t.Fatal(err)
	}
	waitApplied(t, &a, 2)
}

func waitApplied(t *testing.T, a *applied, n int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		a.mu.Lock()
		got := len(a.policies)
		a.mu.Unlock()
		if got >= n {
			return
		}
	}
	t.Fatalf("no reload applied %d policies within 5s", n)
}

// ssmServer answers GetParameter as SSM's JSON 1.1 protocol does, with the value the
// test sets, and counts the calls.
func ssmServer(t *testing.T) (*httptest.Server, *atomic.Value, *atomic.Int32) {
	t.Helper()
	var value atomic.Value
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if got := r.Header.Get("X-Amz-Target"); got != "AmazonSSM.GetParameter" {
			http.Error(w, `{"__type":"UnknownOperationException"}`, http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var in struct {
			Name           string
			WithDecryption bool
		}
		_ = json.Unmarshal(body, &in)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if in.Name != "/tollgate/policy" {
			w.WriteHeader(http.StatusBadRequest)
			_ = json.NewEncoder(w).Encode(map[string]string{"__type": "ParameterNotFound", "message": "no parameter " + in.Name})
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"Parameter": map[string]any{
			"Name": in.Name, "Type": "String", "Value": value.Load().(string), "Version": calls.Load(),
		}})
	}))
	t.Cleanup(srv.Close)
	return srv, &value, &calls
}

// TestParameterRefresh reads the policy through the real SSM client from a fake SSM
// endpoint on loopback: once at the start, then at most once per TTL, applying a
// changed value and refusing an invalid one.
func TestParameterRefresh(t *testing.T) {
	t.Parallel()
	srv, value, calls := ssmServer(t)
	value.Store(policyA)
	client := ssm.NewFromConfig(aws.Config{
		Region:       "eu-central-1",
		Credentials:  credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", ""),
		BaseEndpoint: aws.String(srv.URL),
	})
	var a applied
	ctx := context.Background()
	r, p, err := reload.Load(ctx, a.config(reload.Parameter{Client: client, ParamName: "/tollgate/policy"}, nil))
	if err != nil {
		t.Fatalf("Load = %v", err)
	}
	if !strings.Contains(rate(p), "10/s") || calls.Load() != 1 {
		t.Fatalf("first policy %s after %d calls, want 10/s after 1", rate(p), calls.Load())
	}
	const ttl = time.Hour
	value.Store(policyB)
	if got, _ := r.Refresh(ctx, ttl); got != reload.Unchanged || calls.Load() != 1 {
		t.Errorf("Refresh within the TTL = %s after %d calls, want unchanged without a call", got, calls.Load())
	}
	if got, err := r.Refresh(ctx, 0); got != reload.Applied || len(a.policies) != 1 || !strings.Contains(rate(a.policies[0]), "20/s") {
		t.Errorf("Refresh past the TTL = %s, %v, want the 20/s policy applied", got, err)
	}
	value.Store(badDoc)
	if got, err := r.Refresh(ctx, 0); got != reload.Invalid || !strings.Contains(err.Error(), "ssm:/tollgate/policy") {
		t.Errorf("Refresh(invalid) = %s, %v, want invalid naming the parameter", got, err)
	}
	_, _, err = reload.Load(ctx, a.config(reload.Parameter{Client: client, ParamName: "/missing"}, nil))
	if err == nil || !strings.Contains(err.Error(), "ParameterNotFound") {
		t.Errorf("Load(missing parameter) = %v, want ParameterNotFound", err)
	}
}
