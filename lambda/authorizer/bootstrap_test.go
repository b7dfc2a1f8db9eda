package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// The bootstrap binary is built once per test run, as `make package` builds it
// (but for this machine's GOOS and GOARCH).
var bootstrapBuild struct {
	once sync.Once
	dir  string
	path string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bootstrapBuild.dir != "" {
		os.RemoveAll(bootstrapBuild.dir)
	}
	os.Exit(code)
}

// buildBootstrap builds ./lambda/authorizer as bootstrap with the flags of the
// Lambda package: -tags lambda.norpc, -trimpath, -ldflags "-s -w", CGO_ENABLED=0.
func buildBootstrap(tb testing.TB) string {
	tb.Helper()
	if testing.Short() {
		tb.Skip("builds the bootstrap binary; skipped in -short mode")
	}
	b := &bootstrapBuild
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "tollgate-bootstrap-")
		if b.err != nil {
			return
		}
		gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(gobin); err != nil {
			gobin = "go"
		}
		b.path = filepath.Join(b.dir, "bootstrap")
		cmd := exec.Command(gobin, "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w", "-o", b.path, ".")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if b.err != nil {
		tb.Fatalf("build bootstrap: %v", b.err)
	}
	return b.path
}

// proc is a running bootstrap process.
type proc struct {
	cmd    *exec.Cmd
	stdout *syncBuffer // EMF metric lines
	stderr *syncBuffer // JSON logs
	exited chan struct{}
	err    error // the process's exit, once exited is closed
}

// startBootstrap runs the binary against the runtime API with env (and nothing else
// from this process's environment but PATH).
func startBootstrap(tb testing.TB, bin string, api *runtimeAPI, env map[string]string) *proc {
	tb.Helper()
	p := &proc{stdout: &syncBuffer{}, stderr: &syncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin)
	p.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"AWS_LAMBDA_RUNTIME_API=" + api.Addr(),
		"AWS_LAMBDA_FUNCTION_NAME=tollgate-authorizer",
		"AWS_REGION=us-east-1",
	}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout = p.stdout
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("start bootstrap: %v", err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.exited)
	}()
	tb.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.exited
		if tb.Failed() {
			tb.Logf("bootstrap stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code.
func (p *proc) wait(tb testing.TB, d time.Duration) int {
	tb.Helper()
	select {
	case <-p.exited:
	case <-time.After(d):
		tb.Fatalf("bootstrap still running after %v", d)
	}
	var ee *exec.ExitError
	if errors.As(p.err, &ee) {
		return ee.ExitCode()
	}
	if p.err != nil {
		tb.Fatalf("bootstrap: %v", p.err)
	}
	return 0
}

func absPolicy(tb testing.TB) string {
	tb.Helper()
	p, err := filepath.Abs(testPolicy)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// infoField reads one field of INFO section.
func infoField(tb testing.TB, c *redis.Client, section, field string) int {
	tb.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatalf("INFO %s error = %v", section, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			n, err := strconv.Atoi(v)
			if err != nil {
				tb.Fatalf("INFO %s = %q", field, v)
			}
			return n
		}
	}
	tb.Fatalf("INFO %s has no %s", section, field)
	return 0
}

// TestBootstrapBinary runs the real bootstrap binary against the fake Runtime API and
// a real redis-server: it answers a sequence of events, errors included, keeps
// using the same Redis connections, and shuts down on SIGTERM.
func TestBootstrapBinary(t *testing.T) {
	t.Parallel()
	bin := buildBootstrap(t)
	srv := redistest.StartServer(t)
	probe := srv.Client(t)
	if err := probe.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING error = %v", err)
	}
	api := newRuntimeAPI(t)
	p := startBootstrap(t, bin, api, map[string]string{
		"REDIS_URL":       srv.URL(),
		"TOLLGATE_POLICY": absPolicy(t),
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	stripped := strings.Replace(string(readEvent(t, "rest-token-authorizer.json")), testToken, "", 1)
	steps := []struct {
		name    string
		payload []byte
		allowed string // "allow", "deny", or "" for an error
		errText string
	}{
		{"REST REQUEST 1", readEvent(t, "rest-request-authorizer.json"), "allow", ""},
		{"REST REQUEST 2", readEvent(t, "rest-request-authorizer.json"), "allow", ""},
		{"REST REQUEST 3", readEvent(t, "rest-request-authorizer.json"), "allow", ""},
		{"REST REQUEST 4", readEvent(t, "rest-request-authorizer.json"), "deny", ""},
		{"HTTP API 2.0 (same key, over)", readEvent(t, "http-api-v2-authorizer.json"), "deny", ""},
		{"TOKEN", readEvent(t, "rest-token-authorizer.json"), "allow", ""},
		{"TOKEN without token", []byte(stripped), "", "Unauthorized"},
		{"Function URL", readEvent(t, "function-url.json"), "", "Function URL"},
		{"garbage", []byte("not json at all"), "", "not a JSON object"},
		{"TOKEN again", readEvent(t, "rest-token-authorizer.json"), "allow", ""},
	}
	for _, st := range steps {
		res, err := api.Invoke(ctx, st.payload)
		if err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if st.allowed == "" {
			if !res.isError || !strings.Contains(res.errorMessage(), st.errText) {
				t.Fatalf("%s: answer %s (error %v), want an error containing %q", st.name, res.body, res.isError, st.errText)
			}
			continue
		}
		if res.isError {
			t.Fatalf("%s: error %s, want an answer", st.name, res.body)
		}
		var m map[string]any
		if err := json.Unmarshal(res.body, &m); err != nil {
			t.Fatalf("%s: answer %q is not JSON: %v", st.name, res.body, err)
		}
		got := "deny"
		if v, ok := m["isAuthorized"]; ok {
			if v == true {
				got = "allow"
			}
		} else if strings.Contains(string(res.body), `"Effect":"Allow"`) {
			got = "allow"
		}
		if got != st.allowed {
			t.Fatalf("%s: answer %s, want %s", st.name, res.body, st.allowed)
		}
		if st.allowed == "deny" {
			if ra := m["context"].(map[string]any)["retryAfter"]; ra != 20.0 {
				t.Errorf("%s: retryAfter = %v, want 20", st.name, ra)
			}
		}
	}

	// The connections made so far are all it ever uses: twenty more invocations
	// open none.
	connsBefore := infoField(t, probe, "stats", "total_connections_received")
	for i := range 20 {
		if _, err := api.Invoke(ctx, readEvent(t, "rest-token-authorizer.json")); err != nil {
			t.Fatalf("invocation %d: %v", i, err)
		}
	}
	connsAfter := infoField(t, probe, "stats", "total_connections_received")
	if connsAfter != connsBefore {
		t.Errorf("total_connections_received went from %d to %d over 20 invocations, want no new connection", connsBefore, connsAfter)
	}
	clients := infoField(t, probe, "clients", "connected_clients")
	if clients < 2 || clients > 1+DefaultPoolSize {
		t.Errorf("connected_clients = %d, want the probe and 1 to %d of the function's", clients, DefaultPoolSize)
	}
	list, err := probe.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST error = %v", err)
	}
	t.Logf("CLIENT LIST after %d invocations:\n%s", len(steps)+20, list)

	// One EMF line per invocation on stdout; logs on stderr, all JSON.
	lines := strings.Split(strings.TrimSpace(p.stdout.String()), "\n")
	if want := len(steps) + 20; len(lines) != want {
		t.Errorf("stdout has %d lines, want %d EMF lines", len(lines), want)
	}
	for _, l := range lines {
		if !strings.Contains(l, `"_aws":`) || !json.Valid([]byte(l)) {
			t.Errorf("stdout line %q is not an EMF line", l)
			break
		}
	}
	for _, l := range strings.Split(strings.TrimSpace(p.stderr.String()), "\n") {
		if !json.Valid([]byte(l)) || !strings.Contains(l, `"level":`) {
			t.Errorf("stderr line %q is not a JSON log line with a level", l)
		}
	}

	// SIGTERM closes the client and exits.
	if !api.ExtensionRegistered() {
		t.Errorf("the binary registered no extension: SIGTERM would not be delivered in Lambda")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM: %v", err)
	}
	if code := p.wait(t, 5*time.Second); code != 0 {
		t.Errorf("exit code after SIGTERM = %d, want 0", code)
	}
	if !strings.Contains(p.stderr.String(), `"msg":"shut down"`) {
		t.Errorf("logs lack the shutdown line:\n%s", p.stderr.String())
	}
}

// TestBootstrapInitError starts the binary with a bad policy: it must report an
// init error through the Runtime API, naming the problem, and exit non-zero,
// without asking for an invocation.
func TestBootstrapInitError(t *testing.T) {
	t.Parallel()
	bin := buildBootstrap(t)
	tests := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"bad policy", map[string]string{"TOLLGATE_POLICY_JSON": `{"domain": "d", "failure": {"mode": "sideways"}, "rules": []}`}, "failure.mode"},
		{"missing policy file", map[string]string{}, "policy.yaml"},
		{"bad variable", map[string]string{"TOLLGATE_POLICY": absPolicy(t), "REDIS_POOL_SIZE": "lots"}, "REDIS_POOL_SIZE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api := newRuntimeAPI(t)
			p := startBootstrap(t, bin, api, tt.env)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := api.InitError(ctx)
			if err != nil {
				t.Fatalf("no init error reported: %v\nstderr:\n%s", err, p.stderr.String())
			}
			if msg := res.errorMessage(); !strings.Contains(msg, tt.want) {
				t.Errorf("init error message = %q, want it to name %q", msg, tt.want)
			}
			if res.errorType == "" {
				t.Errorf("init error has no Lambda-Runtime-Function-Error-Type")
			}
			if code := p.wait(t, 10*time.Second); code == 0 {
				t.Errorf("exit code = 0, want non-zero after an init error")
			}
			if n := api.NextCalls(); n != 0 {
				t.Errorf("invocation/next calls = %d, want 0", n)
			}
		})
	}
}

// TestBootstrapRedisDownAtStart starts the binary while Redis is down: the start
// succeeds, the failure mode decides, and once Redis is back it decides there.
func TestBootstrapRedisDownAtStart(t *testing.T) {
	t.Parallel()
	bin := buildBootstrap(t)
	srv := redistest.StartServer(t)
	srv.Kill()
	api := newRuntimeAPI(t)
	startBootstrap(t, bin, api, map[string]string{"REDIS_URL": srv.URL(), "TOLLGATE_POLICY": absPolicy(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := api.Invoke(ctx, readEvent(t, "rest-request-authorizer.json"))
	if err != nil || res.isError {
		t.Fatalf("Invoke() = %s, %v; want an answer", res.body, err)
	}
	if !strings.Contains(string(res.body), `"Effect":"Deny"`) || !strings.Contains(string(res.body), `"retryAfter":1`) {
		t.Errorf("answer with Redis down = %s, want the closed failure mode's Deny with retryAfter 1", res.body)
	}
	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		res, err := api.Invoke(ctx, readEvent(t, "rest-request-authorizer.json"))
		if err != nil {
			t.Fatalf("Invoke() error = %v", err)
		}
		if strings.Contains(string(res.body), `"Effect":"Allow"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %s 5 s after Redis came back, want Allow", res.body)
		}
		time.Sleep(30 * time.Millisecond)
	}
}

// BenchmarkColdStart measures a cold start of the bootstrap binary: from starting
// the process to the first answer through the Runtime API, against a real Redis.
func BenchmarkColdStart(b *testing.B) {
	bin := buildBootstrap(b)
	srv := redistest.StartServer(b)
	payload := readEventForBench(b, "rest-request-authorizer.json")
	var total time.Duration
	for i := 0; b.Loop(); i++ {
		api := newRuntimeAPI(b)
		env := map[string]string{"REDIS_URL": srv.URL(), "TOLLGATE_POLICY": absPolicy(b)}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		p := startBootstrap(b, bin, api, env)
		res, err := api.Invoke(ctx, payload)
		took := time.Since(t0)
		cancel()
		if err != nil || res.isError {
			b.Fatalf("first invocation: %s, %v", res.body, err)
		}
		total += took
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	b.ReportMetric(float64(total.Microseconds())/1000/float64(b.N), "ms-to-first-answer")
	if fi, err := os.Stat(bin); err == nil {
		b.ReportMetric(float64(fi.Size())/(1<<20), "MiB-binary")
	}
}

func readEventForBench(b *testing.B, name string) []byte {
	data, err := readEventFile(name)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

// secretsManager is a fake Secrets Manager endpoint (JSON 1.1 protocol) that serves
// one secret and counts GetSecretValue calls.
func secretsManager(t *testing.T, value string) (string, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Amz-Target") != "secretsmanager.GetSecretValue" ||
			!strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
			http.Error(w, `{"__type":"AccessDeniedException"}`, http.StatusBadRequest)
			return
		}
		calls.Add(1)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]string{"ARN": "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-auth", "SecretString": value})
	}))
	t.Cleanup(srv.Close)
	return srv.URL, &calls
}

// awsEnv is the environment of a function with fake AWS credentials.
func awsEnv(extra map[string]string) map[string]string {
	env := map[string]string{
		"AWS_ACCESS_KEY_ID":         "AKIDEXAMPLE",
		"AWS_SECRET_ACCESS_KEY":     "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
		"AWS_SESSION_TOKEN":         "session-token",
		"AWS_EC2_METADATA_DISABLED": "true",
	}
	for k, v := range extra {
		env[k] = v
	}
	return env
}

// TestBootstrapSecretAuth runs the binary on a redis-server that requires an AUTH
// token kept in (a fake) Secrets Manager: the binary fetches it once, at start,
// through the real AWS SDK, and never logs it.
func TestBootstrapSecretAuth(t *testing.T) {
	t.Parallel()
	bin := buildBootstrap(t)
	const token = "s3cret-auth-token-0123456789abcdef"
	srv := redistest.StartServer(t, redistest.WithArgs("--requirepass", token))
	endpoint, calls := secretsManager(t, token)
	api := newRuntimeAPI(t)
	p := startBootstrap(t, bin, api, awsEnv(map[string]string{
		"REDIS_URL":                        "redis://" + srv.Addr,
		"REDIS_AUTH_SECRET_ARN":            "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-auth",
		"AWS_ENDPOINT_URL_SECRETS_MANAGER": endpoint,
		"TOLLGATE_POLICY":                  absPolicy(t),
		"AWS_LAMBDA_LOG_LEVEL":             "DEBUG",
	}))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i := 1; i <= 4; i++ {
		res, err := api.Invoke(ctx, readEvent(t, "rest-request-authorizer.json"))
		if err != nil || res.isError {
			t.Fatalf("Invoke #%d = %s, %v", i, res.body, err)
		}
		want := `"Effect":"Allow"`
		if i == 4 {
			want = `"Effect":"Deny"`
		}
		if !strings.Contains(string(res.body), want) {
			t.Fatalf("Invoke #%d = %s, want %s (decided on Redis, not the failure mode)", i, res.body, want)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("GetSecretValue calls = %d, want 1", n)
	}
	if out := p.stderr.String() + p.stdout.String(); strings.Contains(out, token) {
		t.Errorf("the token appears in the function's output:\n%s", out)
	}
}

// TestBootstrapIAMAuth runs the binary with IAM authentication against a
// redis-server whose tollgate-user accepts any password: the connections the
// function opens authenticate as the IAM user id, with a token signed at start from
// the environment's credentials. (The token itself is checked, byte for byte, by
// shared/awsredis's golden test.)
func TestBootstrapIAMAuth(t *testing.T) {
	t.Parallel()
	bin := buildBootstrap(t)
	srv := redistest.StartServer(t)
	probe := srv.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := probe.Do(ctx, "ACL", "SETUSER", "tollgate-user", "on", "nopass", "~*", "+@all").Err(); err != nil {
		t.Fatalf("ACL SETUSER error = %v", err)
	}
	api := newRuntimeAPI(t)
	p := startBootstrap(t, bin, api, awsEnv(map[string]string{
		"REDIS_URL":            "redis://" + srv.Addr,
		"REDIS_IAM_USER":       "tollgate-user",
		"REDIS_CACHE_NAME":     "tollgate-cache",
		"REDIS_IAM_SERVERLESS": "true",
		"TOLLGATE_POLICY":      absPolicy(t),
	}))
	res, err := api.Invoke(ctx, readEvent(t, "rest-request-authorizer.json"))
	if err != nil || res.isError || !strings.Contains(string(res.body), `"Effect":"Allow"`) {
		t.Fatalf("Invoke() = %s, %v; want Allow", res.body, err)
	}
	list, err := probe.ClientList(ctx).Result()
	if err != nil {
		t.Fatalf("CLIENT LIST error = %v", err)
	}
	if !strings.Contains(list, "user=tollgate-user") {
		t.Errorf("CLIENT LIST has no connection of tollgate-user:\n%s", list)
	}
	if out := p.stderr.String(); strings.Contains(out, "X-Amz-Signature") || !strings.Contains(out, `"redis_auth":"iam"`) {
		t.Errorf("logs leak the token or lack redis_auth=iam:\n%s", out)
	}
}
