// Command invoke runs a tollgate Lambda function locally on an event file, the way
// Lambda runs it: it builds the function's bootstrap binary, starts an embedded Redis
// (miniredis) and a minimal Lambda Runtime API, starts the binary against both, and
// hands it the event -n times, printing every answer. The Redis state lives in this
// process, so repeated invocations show the limits running out.
//
//	go -C scripts run ./invoke [-n N] [-policy FILE] [-function authorizer|limiter] [-logs] EVENT.json
//
// Paths are the repository root's, wherever it runs from (scripts/invoke.sh and
// `make invoke` run it).
//
// The function is told from the event: a Function URL event goes to the decision
// service (lambda/limiter), an API Gateway authorizer event to lambda/authorizer.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tollgate-dev/tollgate/scripts/internal/repo"
)

func main() {
	err := repo.Chdir()
	if err == nil {
		err = run(os.Args[1:], os.Stdout, os.Stderr)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "invoke:", err)
		os.Exit(1)
	}
}

type options struct {
	n        int
	policy   string
	function string
	logs     bool
	event    string
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("invoke", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.n, "n", 1, "invoke the function `N` times in one process")
	fs.StringVar(&o.policy, "policy", "lambda/policy.yaml", "the policy `file` (TOLLGATE_POLICY)")
	fs.StringVar(&o.function, "function", "", "authorizer or limiter (default: told from the event)")
	fs.BoolVar(&o.logs, "logs", false, "print the function's logs and metric lines to stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: go -C scripts run ./invoke [-n N] [-policy FILE] [-function authorizer|limiter] [-logs] EVENT.json")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return o, errors.New("want one event file")
	}
	o.event = fs.Arg(0)
	if o.n < 1 || o.n > 100000 {
		return o, fmt.Errorf("-n %d: want 1 to 100000", o.n)
	}
	return o, nil
}

func run(args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	payload, err := os.ReadFile(o.event)
	if err != nil {
		return err
	}
	if !json.Valid(payload) {
		fmt.Fprintf(stderr, "invoke: warning: %s is not valid JSON; sending it as it is\n", o.event)
	}
	if o.function == "" {
		o.function = functionFor(payload)
	}
	if o.function != "authorizer" && o.function != "limiter" {
		return fmt.Errorf("-function %q: want authorizer or limiter", o.function)
	}
	policy, err := filepath.Abs(o.policy)
	if err != nil {
		return err
	}

	dir, err := os.MkdirTemp("", "tollgate-invoke-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "bootstrap")
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	root, err := repo.Root(wd)
	if err != nil {
		return err
	}
	build := exec.Command("go", "build", "-tags", "lambda.norpc", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./lambda/"+o.function)
	build.Dir = root
	build.Stdout, build.Stderr = stderr, stderr
	if err := build.Run(); err != nil {
		return fmt.Errorf("build ./lambda/%s: %w", o.function, err)
	}

	mr, err := miniredis.Run()
	if err != nil {
		return fmt.Errorf("start miniredis: %w", err)
	}
	defer mr.Close()
	api := newRuntimeAPI()
	defer api.close()

	fn := exec.Command(bin)
	fn.Env = append(os.Environ(),
		"AWS_LAMBDA_RUNTIME_API="+api.addr(),
		"AWS_LAMBDA_FUNCTION_NAME=tollgate-"+o.function,
		"REDIS_URL=redis://"+mr.Addr(),
		"TOLLGATE_POLICY="+policy,
	)
	fn.Stdout, fn.Stderr = io.Discard, io.Discard
	if o.logs {
		fn.Stdout, fn.Stderr = stderr, stderr
	}
	start := time.Now()
	if err := fn.Start(); err != nil {
		return fmt.Errorf("start the function: %w", err)
	}
	exited := make(chan struct{})
	var waitErr error
	go func() {
		waitErr = fn.Wait()
		close(exited)
	}()
	defer func() {
		_ = fn.Process.Kill()
		<-exited
	}()
	fmt.Fprintf(stderr, "invoke: %s on %s (miniredis %s), policy %s\n", o.function, o.event, mr.Addr(), o.policy)

	for i := 1; i <= o.n; i++ {
		t0 := time.Now()
		res, err := api.invoke(payload, exited)
		if err != nil {
			if waitErr != nil {
				err = fmt.Errorf("%w (%v)", err, waitErr)
			}
			return err
		}
		took := time.Since(t0)
		if i == 1 {
			took = time.Since(start)
		}
		cold := ""
		if i == 1 {
			cold = ", cold start"
		}
		fmt.Fprintf(stdout, "--- invoke %d/%d: %s (%s%s)\n", i, o.n, summary(res), took.Round(10*time.Microsecond), cold)
		fmt.Fprintln(stdout, render(res.body, o.n == 1))
	}
	return nil
}

// functionFor tells the function from the event: a Function URL event (payload 2.0
// with no authorizer "type" and no routeArn) goes to the limiter.
func functionFor(payload []byte) string {
	var p struct {
		Version        string          `json:"version"`
		Type           string          `json:"type"`
		RouteArn       string          `json:"routeArn"`
		RequestContext json.RawMessage `json:"requestContext"`
	}
	if json.Unmarshal(payload, &p) == nil && p.Version == "2.0" && p.Type == "" && p.RouteArn == "" && len(p.RequestContext) > 0 {
		return "limiter"
	}
	return "authorizer"
}

// summary says in a few words what an answer decided.
func summary(a answer) string {
	if a.isError {
		var e struct {
			ErrorMessage string `json:"errorMessage"`
		}
		_ = json.Unmarshal(a.body, &e)
		return "error: " + e.ErrorMessage
	}
	body := a.body
	if pre, _, ok := bytes.Cut(body, streamDelimiter); ok {
		var p struct {
			StatusCode int `json:"statusCode"`
		}
		_ = json.Unmarshal(pre, &p)
		return "HTTP " + strconv.Itoa(p.StatusCode)
	}
	var r struct {
		IsAuthorized   *bool          `json:"isAuthorized"`
		Context        map[string]any `json:"context"`
		PolicyDocument struct {
			Statement []struct{ Effect string } `json:"Statement"`
		} `json:"policyDocument"`
	}
	if json.Unmarshal(body, &r) != nil {
		return "response"
	}
	verdict := "response"
	switch {
	case r.IsAuthorized != nil && *r.IsAuthorized:
		verdict = "isAuthorized=true"
	case r.IsAuthorized != nil:
		verdict = "isAuthorized=false"
	case len(r.PolicyDocument.Statement) > 0:
		verdict = r.PolicyDocument.Statement[0].Effect
	}
	if r.Context != nil {
		verdict += fmt.Sprintf(" rule=%v remaining=%v retryAfter=%v", r.Context["rule"], r.Context["remaining"], r.Context["retryAfter"])
	}
	return verdict
}

// streamDelimiter separates the JSON prelude of a streamed Function URL response
// (status and headers) from its body.
var streamDelimiter = []byte("\x00\x00\x00\x00\x00\x00\x00\x00")

// render formats an answer: JSON indented when pretty, a streamed HTTP response as
// its prelude and body.
func render(body []byte, pretty bool) string {
	if pre, rest, ok := bytes.Cut(body, streamDelimiter); ok {
		return render(pre, pretty) + "\n" + render(rest, pretty)
	}
	var v any
	if json.Unmarshal(body, &v) != nil {
		return string(body)
	}
	var b []byte
	if pretty {
		b, _ = json.MarshalIndent(v, "", "  ")
	} else {
		b, _ = json.Marshal(v)
	}
	return string(b)
}

// runtimeAPI is the minimal Lambda Runtime API of the documentation
// (2018-06-01: invocation/next, invocation/{id}/response and /error, init/error),
// plus the extension registration aws-lambda-go makes to receive SIGTERM.
type runtimeAPI struct {
	srv    *httptest.Server
	events chan invocation
	done   chan struct{}

	mu      sync.Mutex
	waiting map[string]chan answer
	seq     int
	initErr chan answer
}

type invocation struct {
	id      string
	payload []byte
}

type answer struct {
	body    []byte
	isError bool
}

func newRuntimeAPI() *runtimeAPI {
	r := &runtimeAPI{
		events:  make(chan invocation),
		done:    make(chan struct{}),
		waiting: map[string]chan answer{},
		initErr: make(chan answer, 1),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /2018-06-01/runtime/invocation/next", func(w http.ResponseWriter, req *http.Request) {
		select {
		case ev := <-r.events:
			w.Header().Set("Lambda-Runtime-Aws-Request-Id", ev.id)
			w.Header().Set("Lambda-Runtime-Deadline-Ms", strconv.FormatInt(time.Now().Add(30*time.Second).UnixMilli(), 10))
			w.Header().Set("Lambda-Runtime-Invoked-Function-Arn", "arn:aws:lambda:us-east-1:123456789012:function:tollgate-local")
			w.Header().Set("Lambda-Runtime-Trace-Id", "Root=1-00000000-000000000000000000000000;Sampled=0")
			_, _ = w.Write(ev.payload)
		case <-r.done:
			http.Error(w, "shutting down", http.StatusInternalServerError)
		case <-req.Context().Done():
		}
	})
	reply := func(isError bool) http.HandlerFunc {
		return func(w http.ResponseWriter, req *http.Request) {
			body, _ := io.ReadAll(req.Body)
			r.mu.Lock()
			ch := r.waiting[req.PathValue("id")]
			delete(r.waiting, req.PathValue("id"))
			r.mu.Unlock()
			if ch == nil {
				http.Error(w, "unknown request id", http.StatusBadRequest)
				return
			}
			ch <- answer{body: body, isError: isError}
			w.WriteHeader(http.StatusAccepted)
		}
	}
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/response", reply(false))
	mux.HandleFunc("POST /2018-06-01/runtime/invocation/{id}/error", reply(true))
	mux.HandleFunc("POST /2018-06-01/runtime/init/error", func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		select {
		case r.initErr <- answer{body: body, isError: true}:
		default:
		}
		w.WriteHeader(http.StatusAccepted)
	})
	mux.HandleFunc("POST /2020-01-01/extension/register", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Lambda-Extension-Identifier", "local")
		_, _ = io.WriteString(w, "{}")
	})
	mux.HandleFunc("GET /2020-01-01/extension/event/next", func(_ http.ResponseWriter, req *http.Request) {
		select {
		case <-r.done:
		case <-req.Context().Done():
		}
	})
	r.srv = httptest.NewServer(mux)
	return r
}

func (r *runtimeAPI) addr() string { return strings.TrimPrefix(r.srv.URL, "http://") }

func (r *runtimeAPI) close() {
	close(r.done)
	r.srv.CloseClientConnections()
	r.srv.Close()
}

// invoke hands payload to the function and waits for its answer, its init error,
// or its exit.
func (r *runtimeAPI) invoke(payload []byte, exited <-chan struct{}) (answer, error) {
	r.mu.Lock()
	r.seq++
	id := fmt.Sprintf("local-%06d", r.seq)
	ch := make(chan answer, 1)
	r.waiting[id] = ch
	r.mu.Unlock()
	timeout := time.After(60 * time.Second)
	failed := func(err error) error {
		select {
		case ie := <-r.initErr:
			return fmt.Errorf("the function failed to start: %s", ie.body)
		default:
			return err
		}
	}
	select {
	case r.events <- invocation{id: id, payload: payload}:
	case <-exited:
		return answer{}, failed(errors.New("the function exited; run with -logs to see why"))
	case <-timeout:
		return answer{}, errors.New("the function did not ask for an event within 60 s")
	}
	select {
	case a := <-ch:
		return a, nil
	case <-exited:
		return answer{}, failed(errors.New("the function exited; run with -logs to see why"))
	case <-timeout:
		return answer{}, errors.New("no answer within 60 s")
	}
}
