package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestServerSetGet(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	c := s.Client(t)
	ctx := t.Context()

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set(k) = %v, want nil", err)
	}
	if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
		t.Errorf("Get(k) = %q, %v, want %q, nil", got, err, "v")
	}
	if got := s.Do(t, "GET", "missing"); got != nil {
		t.Errorf("Do(GET missing) = %v, want nil", got)
	}
	if got, want := s.URL(), "redis://"+s.Addr; got != want {
		t.Errorf("URL() = %q, want %q", got, want)
	}
}

func TestServerKillRestart(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	c := s.Client(t)
	ctx := t.Context()
	addr := s.Addr

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set(k) = %v, want nil", err)
	}
	s.Kill()
	s.Kill() // idempotent
	assertClosed(t, addr)

	s.Restart(t)
	if s.Addr != addr {
		t.Errorf("Addr after Restart = %q, want %q", s.Addr, addr)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("Ping after Restart = %v, want nil", err)
	}
	if err := c.Get(ctx, "k").Err(); !errors.Is(err, redis.Nil) {
		t.Errorf("Get(k) after Restart = %v, want redis.Nil (no persistence)", err)
	}
	if err := c.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Errorf("Set(k2) after Restart = %v, want nil", err)
	}

	s.Restart(t) // while running: kills first
	if err := c.Ping(ctx).Err(); err != nil {
		t.Errorf("Ping after second Restart = %v, want nil", err)
	}
}

func TestServerStop(t *testing.T) {
	t.Parallel()
	s := StartServer(t)
	s.Stop()
	s.Stop() // idempotent
	assertClosed(t, s.Addr)
	s.Restart(t)
	if got := s.Do(t, "PING"); got != "PONG" {
		t.Errorf("Do(PING) after Stop and Restart = %v, want PONG", got)
	}
}

func TestWithArgsRequirePass(t *testing.T) {
	t.Parallel()
	s := StartServer(t, WithArgs("--requirepass", "s3cret"))
	ctx := t.Context()

	if err := s.Client(t).Ping(ctx).Err(); err != nil {
		t.Errorf("Client().Ping() = %v, want nil", err)
	}
	if got, want := s.URL(), "redis://:s3cret@"+s.Addr; got != want {
		t.Errorf("URL() = %q, want %q", got, want)
	}
	opt, err := redis.ParseURL(s.URL())
	if err != nil {
		t.Fatalf("ParseURL(%q) = %v, want nil", s.URL(), err)
	}
	if got := opt.Password; got != "s3cret" {
		t.Errorf("ParseURL(%q).Password = %q, want %q", s.URL(), got, "s3cret")
	}
	anon := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOAUTH") {
		t.Errorf("Ping() without password = %v, want NOAUTH", err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := StartCluster(t)
	t.Logf("StartCluster took %v", time.Since(start))
	cc := c.Client(t)
	ctx := t.Context()

	const keys = 100
	for i := range keys {
		key := fmt.Sprintf("key:%d", i)
		if err := cc.Set(ctx, key, i, 0).Err(); err != nil {
			t.Fatalf("Set(%s) = %v, want nil", key, err)
		}
	}
	for i := range keys {
		key := fmt.Sprintf("key:%d", i)
		if got, err := cc.Get(ctx, key).Int(); err != nil || got != i {
			t.Fatalf("Get(%s) = %d, %v, want %d, nil", key, got, err, i)
		}
	}

	total := 0
	for _, node := range c.Nodes() {
		n, err := node.Client(t).DBSize(ctx).Result()
		if err != nil {
			t.Fatalf("DBSize() on %s = %v, want nil", node.Addr, err)
		}
		if n == 0 {
			t.Errorf("DBSize() on %s = 0, want keys on every master", node.Addr)
		}
		total += int(n)

		info, err := node.Client(t).ClusterInfo(ctx).Result()
		if err != nil {
			t.Fatalf("ClusterInfo() on %s = %v, want nil", node.Addr, err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			t.Errorf("ClusterInfo() on %s = %q, want cluster_state:ok", node.Addr, info)
		}
	}
	if total != keys {
		t.Errorf("sum of DBSize() = %d, want %d", total, keys)
	}

	opt, err := redis.ParseClusterURL(c.URL())
	if err != nil {
		t.Fatalf("ParseClusterURL(%q) = %v, want nil", c.URL(), err)
	}
	if !reflect.DeepEqual(opt.Addrs, c.Addrs) {
		t.Errorf("ParseClusterURL(%q).Addrs = %v, want %v", c.URL(), opt.Addrs, c.Addrs)
	}
}

func TestClusterNodeRestart(t *testing.T) {
	t.Parallel()
	c := StartCluster(t)
	node := c.Nodes()[1]
	node.Kill()
	assertClosed(t, node.Addr)
	node.Restart(t)

	ctx, cancel := context.WithTimeout(t.Context(), clusterTimeout)
	defer cancel()
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("cluster after node Restart: %v", err)
	}
}

func TestCleanupStopsProcesses(t *testing.T) {
	t.Parallel()
	requireBinaries(t, serverBinary, cliBinary)
	var addrs []string
	t.Run("start", func(t *testing.T) {
		addrs = append(addrs, StartServer(t).Addr)
		addrs = append(addrs, StartCluster(t).Addrs...)
		for _, addr := range addrs {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Fatalf("Dial(%s) while running = %v, want nil", addr, err)
			}
			conn.Close()
		}
	})
	if len(addrs) != 1+clusterSize {
		t.Fatalf("started %d servers, want %d", len(addrs), 1+clusterSize)
	}
	for _, addr := range addrs {
		assertClosed(t, addr)
	}
}

func TestCluster_URL(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addrs []string
		want  string
	}{
		{[]string{"127.0.0.1:1"}, "redis://127.0.0.1:1"},
		{[]string{"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}, "redis://127.0.0.1:1?addr=127.0.0.1:2&addr=127.0.0.1:3"},
	}
	for _, tt := range tests {
		c := &Cluster{Addrs: tt.addrs}
		if got := c.URL(); got != tt.want {
			t.Errorf("URL(%v) = %q, want %q", tt.addrs, got, tt.want)
		}
	}
}

func TestPasswordFrom(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"--requirepass"}, ""},
		{[]string{"--requirepass", "x"}, "x"},
		{[]string{"--maxmemory", "1mb", "--requirepass", "a", "--requirepass", "b"}, "b"},
	}
	for _, tt := range tests {
		if got := passwordFrom(tt.args); got != tt.want {
			t.Errorf("passwordFrom(%q) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

func TestFreePortsBus(t *testing.T) {
	t.Parallel()
	ports, err := freePorts(clusterSize, true)
	if err != nil {
		t.Fatalf("freePorts(%d, true) = %v, want nil", clusterSize, err)
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if p+busOffset > 65535 {
			t.Errorf("freePorts(%d, true) gave %d, want bus port <= 65535", clusterSize, p)
		}
		if seen[p] {
			t.Errorf("freePorts(%d, true) = %v, want distinct ports", clusterSize, ports)
		}
		seen[p] = true
	}
}

// assertClosed fails t unless nothing accepts connections on addr.
func assertClosed(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err == nil {
		conn.Close()
		t.Errorf("Dial(%s) after stop = nil, want connection refused", addr)
	}
}

func TestSpawnPortInUse(t *testing.T) {
	t.Parallel()
	other := StartServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("Listen() = %v, want nil", err)
	}
	defer l.Close()

	tests := []struct {
		name string
		addr string
	}{
		{"plain listener", l.Addr().String()},
		{"another redis-server", other.Addr},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newServer(t, nil, false)
			_, port, _ := net.SplitHostPort(tt.addr)
			p, _ := strconv.Atoi(port)
			s.setPort(p)
			if err := s.spawn(); !errors.Is(err, errPortInUse) {
				t.Errorf("spawn() on %s taken by a %s = %v, want errPortInUse", tt.addr, tt.name, err)
			}
		})
	}
}

// recordingTB records a skip or a failure instead of ending the test with it; like
// testing.T it stops the goroutine that asked (see run).
type recordingTB struct {
	testing.TB
	skipped, failed string
}

func (r *recordingTB) Skipf(format string, args ...any) {
	r.skipped = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (r *recordingTB) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f(r) on a goroutine of its own, which Skipf and Fatalf may end.
func (r *recordingTB) run(f func(testing.TB)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
}

// TestRequireSentinel checks RequireSentinel against a PATH that holds only the
// programs a case names: it skips, or fails under CI=true, naming the package to
// install, and lets the test run when both programs are there.
func TestRequireSentinel(t *testing.T) {
	tests := []struct {
		name              string
		programs          []string
		ci                string
		wantSkip, wantErr string
	}{
		{"both present", []string{serverBinary, sentinelBinary}, "true", "", ""},
		{"sentinel missing", []string{serverBinary}, "", "apt-get install -y redis-sentinel", ""},
		{"sentinel missing on CI", []string{serverBinary}, "true", "", "apt-get install -y redis-sentinel"},
		{"server missing", []string{sentinelBinary}, "", "apt-get install -y redis-server", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, p := range tc.programs {
				if err := os.WriteFile(filepath.Join(dir, p), []byte("#!/bin/sh\n"), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			t.Setenv("PATH", dir)
			t.Setenv("CI", tc.ci)
			r := &recordingTB{TB: t}
			r.run(RequireSentinel)
			if !strings.Contains(r.skipped, tc.wantSkip) || (tc.wantSkip == "") != (r.skipped == "") ||
				!strings.Contains(r.failed, tc.wantErr) || (tc.wantErr == "") != (r.failed == "") {
				t.Errorf("RequireSentinel() skipped %q, failed %q; want a skip naming %q, a failure naming %q", r.skipped, r.failed, tc.wantSkip, tc.wantErr)
			}
			if got, want := SentinelAvailable(), slices.Contains(tc.programs, sentinelBinary); got != want {
				t.Errorf("SentinelAvailable() = %v, want %v", got, want)
			}
		})
	}
}
