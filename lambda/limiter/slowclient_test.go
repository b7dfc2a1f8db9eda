package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The slow-client tests run the real limiter binary as a subprocess, so that its
// goroutines (go_goroutines on /metrics) and resident memory (VmRSS in
// /proc/PID/status) are the server's alone.

// slowConns is how many connections trickle a body at the server at once. The test
// process holds one descriptor for each and the server another, so both need a
// RLIMIT_NOFILE above it; Go raises the soft limit to the hard one at start, and
// requireDescriptors skips (fails under CI=true) where that is still too low.
const slowConns = 1000

// goroutineSlack is how far above its baseline the server's goroutine count may read
// once the slow clients are gone: the connections the test itself has just used to
// ask (GET /metrics, a decision) may still be closing.
const goroutineSlack = 5

// checkBody is a request body of the default policy, 55 bytes long like the probe's.
const checkBody = `{"domain":"public-api","attributes":{"api_key":"k1"}}  `

var buildOnce struct {
	sync.Once
	path string
	err  error
}

// limiterBinary builds the limiter once for the package's tests.
func limiterBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "limiter-test-")
		if err != nil {
			buildOnce.err = err
			return
		}
		buildOnce.path = filepath.Join(dir, "limiter")
		out, err := exec.Command("go", "build", "-o", buildOnce.path, ".").CombinedOutput()
		if err != nil {
			buildOnce.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildOnce.err != nil {
		t.Fatal(buildOnce.err)
	}
	return buildOnce.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildOnce.path != "" {
		os.RemoveAll(filepath.Dir(buildOnce.path))
	}
	os.Exit(code)
}

// requireDescriptors skips t, or fails it under CI=true, unless this process may
// open n more files.
func requireDescriptors(t *testing.T, n int) {
	t.Helper()
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Cur >= uint64(n)+256 {
		return
	}
	msg := fmt.Sprintf("RLIMIT_NOFILE is %d (hard %d); this test needs %d: raise it with ulimit -n", lim.Cur, lim.Max, n+256)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// process is a running limiter binary.
type process struct {
	cmd    *exec.Cmd
	url    string
	exited chan struct{}
	mu     sync.Mutex
	log    []string // its JSON log lines
}

// startLimiter runs the limiter on a free loopback port with the embedded Redis, the
// default policy, and args, and waits for it to listen.
func startLimiter(t *testing.T, args ...string) *process {
	t.Helper()
	return startLimiterEnv(t, nil, args...)
}

// startLimiterEnv is startLimiter with env (NAME=value) added to its environment.
func startLimiterEnv(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	return startProcess(t, "", env, append([]string{"--listen", "127.0.0.1:0", "--policy", "../policy.yaml"}, args...)...)
}

// startProcess runs the limiter binary in dir (empty: this one) with env (NAME=value)
// and args alone, and waits for it to listen.
func startProcess(t *testing.T, dir string, env []string, args ...string) *process {
	t.Helper()
	p, err := tryStartProcess(t, dir, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// tryStartProcess is startProcess, returning an error when the limiter does not
// come to listen (its log in the error), for a caller that may try again.
func tryStartProcess(t *testing.T, dir string, env []string, args ...string) (*process, error) {
	t.Helper()
	cmd := exec.Command(limiterBinary(t), args...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH")}, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log = append(p.log, line)
			p.mu.Unlock()
			var l struct{ Msg, Addr string }
			if json.Unmarshal([]byte(line), &l) == nil && l.Msg == "listening" {
				addr <- l.Addr
			}
		}
	}()
	go func() { cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-p.exited
	})
	select {
	case a := <-addr:
		p.url = "http://" + a
		return p, nil
	case <-p.exited:
		return nil, fmt.Errorf("limiter exited before listening: %s", p.logText())
	case <-time.After(30 * time.Second):
		return nil, fmt.Errorf("limiter did not listen within 30s: %s", p.logText())
	}
}

func (p *process) logText() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.log, "\n")
}

// rssKiB is the process's resident set size, from /proc/PID/status.
func (p *process) rssKiB(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatal("no VmRSS in /proc/PID/status")
	return 0
}

// client makes one request per connection, so that it leaves no idle connection
// (and goroutine) behind in the server.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// goroutines reads go_goroutines from the process's /metrics.
func (p *process) goroutines(t *testing.T) int {
	t.Helper()
	resp, err := client.Get(p.url + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatalf("go_goroutines %q: %v", v, err)
			}
			return n
		}
	}
	t.Fatal("GET /metrics: no go_goroutines")
	return 0
}

// decide sends one normal decision and returns its status, or an error.
func (p *process) decide() (int, error) {
	resp, err := client.Post(p.url+"/v1/check", "application/json", strings.NewReader(checkBody))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// trickle is one slow client: complete headers announcing checkBody, then the body
// one byte every interval. It reports how many body bytes it had sent when the
// server closed the connection, or an error if the connection outlived wait.
type trickled struct {
	sent int
	err  error
}

func trickle(addr string, interval, wait time.Duration) trickled {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return trickled{err: err}
	}
	defer c.Close()
	hdr := fmt.Sprintf("POST /v1/check HTTP/1.1\r\nHost: tollgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", len(checkBody))
	if _, err := io.WriteString(c, hdr); err != nil {
		return trickled{err: err}
	}
	closed := make(chan struct{})
	go func() {
		// Whatever the server answers (a 400 once the read timed out, or nothing), it
		// then closes the connection: the read ends with EOF or a reset.
		io.Copy(io.Discard, c)
		close(closed)
	}()
	deadline := time.After(wait)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	sent := 0
	for {
		select {
		case <-closed:
			return trickled{sent: sent}
		case <-deadline:
			return trickled{sent: sent, err: fmt.Errorf("still open after %v with %d of %d body bytes sent", wait, sent, len(checkBody))}
		case <-tick.C:
			if sent < len(checkBody)-1 { // never complete the body
				if _, err := c.Write([]byte{checkBody[sent]}); err == nil {
					sent++
				}
			}
		}
	}
}

// TestSlowClientsAreClosed sends two waves of slowConns connections that trickle
// their bodies one byte at a time. It checks that the server's read timeout closes
// every one of them before its body is complete, that normal decisions are answered
// all the while, that the server's goroutines come back to their baseline after each
// wave (a connection leaked would keep its goroutine). Resident memory is logged.
func TestSlowClientsAreClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the limiter binary and 1,000 connections")
	}
	requireDescriptors(t, slowConns)
	// The read timeout (3 s) is long enough for every slow client of a wave to be
	// connected at once on a busy machine, so the goroutines' peak shows them held.
	p := startLimiter(t, "--read-timeout", "3s", "--write-timeout", "5s", "--idle-timeout", "2s",
		"--max-conns", strconv.Itoa(slowConns+100), "--shutdown-grace", "1s")
	for range 50 { // warm up: the first decisions load scripts and grow the heap
		if _, err := p.decide(); err != nil {
			t.Fatal(err)
		}
	}
	baseG, baseRSS := p.goroutines(t), p.rssKiB(t)
	var after, peak [2]int
	for wave := range after {
		peakG, peakRSS, answered := p.slowWave(t)
		peak[wave] = peakRSS
		if peakG < baseG+slowConns*9/10 {
			t.Fatalf("wave %d: goroutines peaked at %d from %d: the slow clients were never held, so this test proves nothing", wave, peakG, baseG)
		}
		g, rss := p.settle(t, baseG)
		after[wave] = rss
		t.Logf("wave %d: goroutines %d -> %d -> %d; RSS %d -> %d -> %d KiB; %d decisions answered meanwhile", wave, baseG, peakG, g, baseRSS, peakRSS, rss, answered)
		if g > baseG+goroutineSlack {
			t.Errorf("wave %d: goroutines = %d after the slow clients left, want the baseline %d (+%d)", wave, g, baseG, goroutineSlack)
		}
	}
}

// slowWave runs slowConns trickling clients against p and waits for the server to
// close all of them, deciding normal requests meanwhile. It returns the peak of the
// server's goroutines and RSS, and how many decisions it answered.
func (p *process) slowWave(t *testing.T) (peakG, peakRSS, answered int) {
	t.Helper()
	addr := strings.TrimPrefix(p.url, "http://")
	var wg sync.WaitGroup
	results := make([]trickled, slowConns)
	for i := range results {
		wg.Go(func() { results[i] = trickle(addr, 100*time.Millisecond, time.Minute) })
	}
	allClosed := make(chan struct{})
	go func() { wg.Wait(); close(allClosed) }()
	for done := false; !done; {
		select {
		case <-allClosed:
			done = true
		case <-time.After(100 * time.Millisecond):
			peakG, peakRSS = max(peakG, p.goroutines(t)), max(peakRSS, p.rssKiB(t))
			status, err := p.decide()
			if err != nil || status != http.StatusOK && status != http.StatusTooManyRequests {
				t.Fatalf("Check() during the slow clients = %d, %v, want 200 or 429", status, err)
			}
			answered++
		}
	}
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("slow client %d: %v", i, r.err)
		}
		if r.sent >= len(checkBody) {
			t.Fatalf("slow client %d sent its whole body; want it cut off by the read timeout", i)
		}
	}
	return peakG, peakRSS, answered
}

// settle keeps deciding until the server's goroutines are back to baseG
// (+goroutineSlack), for at most 20 s, and returns them with the RSS then.
func (p *process) settle(t *testing.T, baseG int) (g, rss int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := p.decide(); err != nil {
			t.Fatal(err)
		}
		g, rss = p.goroutines(t), p.rssKiB(t)
		if g <= baseG+goroutineSlack || time.Now().After(deadline) {
			return g, rss
		}
	}
}

// TestSigtermWithSlowClients sends SIGTERM to a server that slow clients hold, with a
// read timeout far longer than the test, and checks that it exits cleanly within its
// shutdown grace (plus generous slack), closing their connections.
func TestSigtermWithSlowClients(t *testing.T) {
	const grace = 500 * time.Millisecond
	p := startLimiter(t, "--read-timeout", "5m", "--write-timeout", "10m", "--idle-timeout", "5m", "--shutdown-grace", grace.String())
	addr := strings.TrimPrefix(p.url, "http://")
	base := p.goroutines(t)
	const n = 20
	results := make(chan trickled, n+1)
	for range n {
		go func() { results <- trickle(addr, 200*time.Millisecond, time.Minute) }()
	}
	idle, err := net.Dial("tcp", addr) // a keep-alive connection between requests
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	fmt.Fprintf(idle, "GET /healthz HTTP/1.1\r\nHost: tollgate\r\n\r\n")
	if resp, err := http.ReadResponse(bufio.NewReader(idle), nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /healthz on a keep-alive connection = %v, %v", resp, err)
	}
	for p.goroutines(t) < base+n { // every slow client is in
		time.Sleep(50 * time.Millisecond)
	}

	start := time.Now()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
	case <-time.After(grace + 20*time.Second):
		t.Fatalf("limiter still running %v after SIGTERM with a %v grace", time.Since(start), grace)
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("limiter exit code = %d after SIGTERM, want 0; log:\n%s", code, p.logText())
	}
	if !strings.Contains(p.logText(), "shutdown grace expired") {
		t.Errorf("log has no \"shutdown grace expired\", want the slow clients closed after the grace:\n%s", p.logText())
	}
	for range n {
		if r := <-results; r.err != nil || r.sent >= len(checkBody) {
			t.Errorf("slow client after SIGTERM = %+v, want its connection closed mid-body", r)
		}
	}
	idle.SetReadDeadline(time.Now().Add(10 * time.Second))
	if b, err := io.ReadAll(idle); len(b) > 0 || isTimeout(err) {
		t.Errorf("keep-alive connection after SIGTERM read %q, %v, want it closed", b, err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestConnectionCap serves a handler that holds its requests with --max-conns 2: two
// held requests take both connections, a third waits to be accepted until one of
// them is answered, and shutting down wakes the listener's waiting Accept.
func TestConnectionCap(t *testing.T) {
	release := make(chan struct{})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/hold" {
			<-release
		}
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limits := defaultServerLimits
	limits.MaxConns = 2
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serve(ctx, ln, h, limits, slog.New(slog.NewTextHandler(io.Discard, nil))) }()
	url := "http://" + ln.Addr().String()

	get := func(path string) <-chan error {
		done := make(chan error, 1)
		go func() {
			resp, err := client.Get(url + path)
			if err == nil {
				resp.Body.Close()
			}
			done <- err
		}()
		return done
	}
	held := []<-chan error{get("/hold"), get("/hold")}
	time.Sleep(200 * time.Millisecond) // let both be accepted (if the cap let a third in, it would answer at once)
	third := get("/fast")
	select {
	case err := <-third:
		t.Fatalf("GET /fast with both connections held = %v, want it to wait for a free connection", err)
	case <-time.After(500 * time.Millisecond):
	}
	release <- struct{}{} // answer one held request; its connection closes
	if err := <-third; err != nil {
		t.Fatalf("GET /fast after a connection was freed: %v", err)
	}
	close(release)
	for _, c := range held {
		if err := <-c; err != nil {
			t.Fatalf("GET /hold: %v", err)
		}
	}
	cancel()
	if err := <-served; err != nil {
		t.Fatalf("serve() after shutdown = %v, want nil", err)
	}
}

// TestIdleConnectionsClosed checks that a keep-alive connection left idle after an
// answer is closed by the server once --idle-timeout passes.
func TestIdleConnectionsClosed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	limits := defaultServerLimits
	limits.IdleTimeout = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go serve(ctx, ln, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), limits, slog.New(slog.NewTextHandler(io.Discard, nil)))

	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: tollgate\r\n\r\n")
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil || resp.Close {
		t.Fatalf("GET / = %v, %v, want a keep-alive answer", resp, err)
	}
	resp.Body.Close()
	c.SetReadDeadline(time.Now().Add(30 * time.Second)) // far beyond the idle timeout
	if b, err := io.ReadAll(r); len(b) > 0 || isTimeout(err) {
		t.Errorf("idle keep-alive connection read %q, %v, want it closed by the server", b, err)
	}
}
