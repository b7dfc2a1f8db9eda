package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandLine runs the limiter's command line in process, on every path that
// does not serve: help, usage errors and the policy commands' help and flags.
func TestCommandLine(t *testing.T) {
	t.Parallel()
	policyFile, err := filepath.Abs(shippedPolicy)
	if err != nil {
		t.Fatal(err)
	}
	usageParts := []string{"limiter policy check FILE", "limiter policy explain", "--listen ADDR (default 127.0.0.1:8080)", "TOLLGATE_LISTEN",
		"--policy FILE", "built into the binary", "--embedded-redis ADDR", "TOLLGATE_ADMIN_TOKEN", "--read-timeout DURATION (default 5s)"}
	tests := []struct {
		name       string
		args       []string
		code       int
		stdout     []string // each in stdout
		stderr     []string // each in stderr
		quietError bool     // nothing on stderr
	}{
		{"--help", []string{"--help"}, 0, usageParts, nil, true},
		{"-h", []string{"-h"}, 0, usageParts, nil, true},
		{"help", []string{"help"}, 0, usageParts, nil, true},
		{"help policy", []string{"help", "policy"}, 0, []string{"limiter policy check FILE"}, nil, true},
		{"unknown word", []string{"foo", "bar"}, 2, nil, append([]string{`unknown command "foo"`}, usageParts...), false},
		{"word after flags", []string{"--listen", "127.0.0.1:0", "serve"}, 2, nil, []string{`unexpected argument "serve"`, "limiter policy check FILE"}, false},
		{"unknown flag", []string{"--colour"}, 2, nil, []string{"flag provided but not defined: -colour", "limiter policy check FILE"}, false},
		{"flag without its value", []string{"--listen"}, 2, nil, []string{"flag needs an argument: -listen"}, false},
		{"policy --help", []string{"policy", "--help"}, 0, []string{"limiter policy explain"}, nil, true},
		{"policy check --help", []string{"policy", "check", "--help"}, 0, []string{"limiter policy check FILE"}, nil, true},
		{"policy check -h after a file", []string{"policy", "check", policyFile, "-h"}, 0, []string{"limiter policy check FILE"}, nil, true},
		{"policy check with an unknown flag", []string{"policy", "check", "--strict", policyFile}, 2, []string{"flag provided but not defined: -strict", "limiter policy check FILE"}, nil, true},
		{"policy check without a file", []string{"policy", "check"}, 2, []string{"name at least one policy file"}, nil, true},
		{"policy explain --help", []string{"policy", "explain", "--help"}, 0, []string{"limiter policy explain [--redis URL]", "  --redis URL\n", "  --cluster\n"}, nil, true},
		{"policy explain, flags after the file", []string{"policy", "explain", policyFile, "--cluster", "api_key=k", "path=/login"}, 0,
			[]string{`domain public-api, request api_key="k" path="/login"`, "rule per-key: applies"}, nil, true},
		{"policy explain, words after --", []string{"policy", "explain", "--", policyFile, "api_key=k"}, 0, []string{"rule per-key: applies"}, nil, true},
		{"policy explain, a bare word", []string{"policy", "explain", policyFile, "--cluster", "path"}, 2, []string{`"path": want ATTRIBUTE=VALUE`}, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := command(context.Background(), env(nil), tc.args, &stdout, &stderr)
			if code != tc.code {
				t.Errorf("limiter %q = exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.code, &stdout, &stderr)
			}
			for _, want := range tc.stdout {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("limiter %q: stdout lacks %q:\n%s", tc.args, want, &stdout)
				}
			}
			for _, want := range tc.stderr {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("limiter %q: stderr lacks %q:\n%s", tc.args, want, &stderr)
				}
			}
			if tc.quietError && stderr.Len() > 0 {
				t.Errorf("limiter %q: stderr = %q, want nothing", tc.args, &stderr)
			}
		})
	}
	t.Run("--help with a bad variable", func(t *testing.T) {
		t.Parallel()
		var stdout, stderr bytes.Buffer
		code := command(context.Background(), env(map[string]string{"TOLLGATE_BATCH": "sometimes"}), []string{"--help"}, &stdout, &stderr)
		if code != 0 || !strings.Contains(stdout.String(), "--listen ADDR") {
			t.Errorf("limiter --help with TOLLGATE_BATCH=sometimes = exit %d, stdout %q, stderr %q; want 0 and the usage", code, &stdout, &stderr)
		}
	})
}

// freeAddr returns a loopback address nothing listens on (at the time of the call).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// logLine returns the first of p's JSON log lines whose msg is msg, decoded.
func (p *process) logLine(t *testing.T, msg string) map[string]any {
	t.Helper()
	for _, line := range strings.Split(p.logText(), "\n") {
		var l map[string]any
		if json.Unmarshal([]byte(line), &l) == nil && l["msg"] == msg {
			return l
		}
	}
	t.Fatalf("no log line %q in:\n%s", msg, p.logText())
	return nil
}

// TestOutsideRepository runs the binary in an empty directory with no flags: it
// decides with the policy built into it, its embedded Redis listens where
// TOLLGATE_EMBEDDED_REDIS says and logs its URL, and policy explain reads the
// state there.
func TestOutsideRepository(t *testing.T) {
	t.Parallel()
	redisAddr := freeAddr(t)
	p := startProcess(t, t.TempDir(), []string{"TOLLGATE_LISTEN=127.0.0.1:0", "TOLLGATE_EMBEDDED_REDIS=" + redisAddr})
	if src := p.logLine(t, "policy loaded")["source"]; src != "built-in lambda/policy.yaml" {
		t.Errorf("policy loaded from %v, want the built-in lambda/policy.yaml", src)
	}
	url := p.logLine(t, "embedded Redis listening")["url"]
	if url != "redis://"+redisAddr {
		t.Fatalf("embedded Redis's logged url = %v, want redis://%s", url, redisAddr)
	}
	for range 3 {
		if code, err := p.decide(); err != nil || code != 200 {
			t.Fatalf("decide() = %d, %v; want 200", code, err)
		}
	}
	policyFile, err := filepath.Abs(shippedPolicy)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(limiterBinary(t), "policy", "explain", policyFile, "api_key=k1", "--redis", url.(string)).CombinedOutput()
	// fixed_window 10000/day, after three decisions of api_key k1.
	if err != nil || !strings.Contains(string(out), "9997 of 10000 left") {
		t.Errorf("policy explain --redis %s = %v:\n%s\nwant each limit's state", url, err, out)
	}
}

// TestRedisDownLogsJSON runs the binary against a Redis that is not there: go-redis's
// own complaints come through the service's JSON log, not as plain text lines.
func TestRedisDownLogsJSON(t *testing.T) {
	t.Parallel()
	p := startLimiterEnv(t, []string{"REDIS_URL=redis://" + freeAddr(t)})
	if code, err := p.decide(); err != nil || code != 200 { // the default policy fails open
		t.Fatalf("decide() with Redis down = %d, %v; want 200", code, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(p.logText(), `"from":"go-redis"`) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	text := p.logText()
	if !strings.Contains(text, `"from":"go-redis"`) {
		t.Errorf("no go-redis line in the log:\n%s", text)
	}
	for _, line := range strings.Split(text, "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("log line %q is not JSON", line)
		}
	}
}

// TestListenAddressInUse starts the service on an address another listener holds: the
// error says how to choose another.
func TestListenAddressInUse(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = run(context.Background(), env(map[string]string{"TOLLGATE_POLICY": shippedPolicy, "TOLLGATE_LISTEN": ln.Addr().String()}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	for _, want := range []string{"address already in use", "--listen ADDR", "TOLLGATE_LISTEN=ADDR", "make run LISTEN=ADDR"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("run() on a busy address = %v, want an error naming %q", err, want)
		}
	}
}
