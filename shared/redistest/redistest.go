// Package redistest starts real redis-server processes for tests.
//
// StartServer runs one standalone server, StartCluster a three-master Redis
// Cluster (with replicas, if asked), and StartSentinel a master, a replica
// and three Sentinels, each on free loopback ports, in a directory from
// t.TempDir, without persistence. Every process is killed and reaped when the
// test that started it ends, whether it passed or not. Helpers find the
// master of a slot, and wait for a replica's promotion after a test kills
// its master.
//
// When redis-server (or redis-sentinel) is not on PATH the test is skipped,
// unless the environment has CI=true, in which case it fails: CI must
// install Redis. `make test` installs both when it can (scripts/deps.sh).
package redistest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/redisinfo"
)

const (
	serverBinary   = "redis-server"
	cliBinary      = "redis-cli"
	sentinelBinary = "redis-sentinel"

	// readyTimeout bounds how long a starting server may take to answer.
	readyTimeout = 5 * time.Second
	// probeTimeout bounds one readiness probe.
	probeTimeout = 500 * time.Millisecond
	// pollInterval is the pause between readiness probes.
	pollInterval = 10 * time.Millisecond
	// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// startAttempts is how many fresh ports a start tries before giving up.
	startAttempts = 5

	// clusterSize is the number of masters StartCluster runs.
	clusterSize = 3
	// clusterSlots is the number of hash slots in a Redis Cluster.
	clusterSlots = 16384
	// busOffset is the distance from a cluster node's port to its bus port.
	busOffset = 10000
	// clusterTimeout bounds cluster creation and convergence.
	clusterTimeout = 30 * time.Second
	// sentinelTimeout bounds the wait for the Sentinels to see the group: longer
	// than a Sentinel's TILT period (30 s).
	sentinelTimeout = 60 * time.Second
)

// errPortInUse reports that a server could not have its port: the address
// was taken, or another process answered on it.
var errPortInUse = errors.New("port in use")

// Available reports whether redis-server is on PATH. StartCluster also needs
// redis-cli, which Debian's redis-server package brings along.
func Available() bool {
	_, err := exec.LookPath(serverBinary)
	return err == nil
}

// SentinelAvailable reports whether redis-sentinel is on PATH. Debian ships it
// in its own package, redis-sentinel.
func SentinelAvailable() bool {
	_, err := exec.LookPath(sentinelBinary)
	return err == nil
}

// RequireSentinel skips t, or fails it when CI=true, unless redis-server and
// redis-sentinel are both on PATH.
func RequireSentinel(t testing.TB) {
	t.Helper()
	requireBinaries(t, serverBinary, sentinelBinary)
}

// debianPackage names the Debian package that installs a program.
var debianPackage = map[string]string{
	serverBinary:   "redis-server",
	cliBinary:      "redis-server",
	sentinelBinary: "redis-sentinel",
}

// requireBinaries skips t, or fails it when CI=true, unless every named
// program is on PATH.
func requireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, name := range names {
		if _, err := exec.LookPath(name); err == nil {
			continue
		}
		install := "apt-get install -y " + debianPackage[name]
		if os.Getenv("CI") == "true" {
			t.Fatalf("redistest: %s not found; CI must install it: %s (scripts/deps.sh does)", name, install)
		}
		t.Skipf("SKIPPING real-Redis test: %s not installed (%s, or run make test, which installs it when it can)", name, install)
	}
}

// An Option changes how StartServer runs redis-server.
type Option func(*options)

type options struct {
	args []string
}

// WithArgs appends args to the redis-server command line, after the ones
// redistest sets, so they win over its defaults. A "--requirepass", "PW"
// pair is also used by URL, Client and Do.
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// Server is one redis-server process listening on loopback. Kill and Stop
// may be called from any goroutine.
type Server struct {
	// Addr is the server's "127.0.0.1:PORT"; it stays the same across
	// Restart.
	Addr string

	port     int
	dir      string
	logPath  string
	extra    []string
	cluster  bool
	password string

	// sentinelConf, when set, makes the process a Sentinel (redis-sentinel)
	// that reads and rewrites this configuration file.
	sentinelConf string

	mu   sync.Mutex
	cmd  *exec.Cmd     // nil when no process is running
	done chan struct{} // closed when cmd has exited and been reaped
}

// StartServer starts a standalone redis-server on a free loopback port and
// waits until it answers. The process is killed when t ends.
func StartServer(t testing.TB, opts ...Option) *Server {
	t.Helper()
	requireBinaries(t, serverBinary)
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	s := newServer(t, o.args, false)
	if err := s.startFresh(false); err != nil {
		s.logStartFailure(t)
		t.Fatalf("redistest: start redis-server: %v", err)
	}
	return s
}

// newServer makes a Server with its own directory from t.TempDir and
// registers the cleanup that kills it. The cleanup is registered after the
// directory's, so it runs first.
func newServer(t testing.TB, extra []string, cluster bool) *Server {
	t.Helper()
	dir := t.TempDir()
	s := &Server{
		dir:      dir,
		logPath:  dir + string(os.PathSeparator) + "redis.log",
		extra:    append([]string(nil), extra...),
		cluster:  cluster,
		password: passwordFrom(extra),
	}
	t.Cleanup(s.Kill)
	return s
}

// passwordFrom returns the value after the last "--requirepass" in args.
func passwordFrom(args []string) string {
	var pw string
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--requirepass" {
			pw = args[i+1]
		}
	}
	return pw
}

// setPort points s at port.
func (s *Server) setPort(port int) {
	s.port = port
	s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
}

// startFresh starts s on a newly picked port, trying other ports while the
// picked one turns out to be taken. A cluster node needs its bus port free
// too.
func (s *Server) startFresh(bus bool) error {
	var err error
	for attempt := 0; attempt < startAttempts; attempt++ {
		var ports []int
		ports, err = freePorts(1, bus)
		if err != nil {
			return err
		}
		s.setPort(ports[0])
		err = s.spawn()
		if !errors.Is(err, errPortInUse) {
			return err
		}
	}
	return fmt.Errorf("%d attempts: %w", startAttempts, err)
}

// binary is the program s runs.
func (s *Server) binary() string {
	if s.sentinelConf != "" {
		return sentinelBinary
	}
	return serverBinary
}

// argv is the command line for s.
func (s *Server) argv() []string {
	if s.sentinelConf != "" {
		return sentinelArgv(s)
	}
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--protected-mode", "yes",
	}
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "2000",
		)
	}
	return append(args, s.extra...)
}

// spawn starts the process on s.port and waits until it answers as itself.
// Its output is appended to the log file. On failure the process is killed;
// the error wraps errPortInUse when the port was taken.
func (s *Server) spawn() error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open log: %w", err)
	}
	fmt.Fprintf(logFile, "--- redistest: starting %s on %s\n", s.binary(), s.Addr)
	cmd := exec.Command(s.binary(), s.argv()...)
	cmd.Dir = s.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = sysProcAttr()
	err = cmd.Start()
	logFile.Close() // the child has its own copy
	if err != nil {
		return fmt.Errorf("run %s: %w", s.binary(), err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait() // reap, so no zombie is left
		close(done)
	}()
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()

	if err := waitReady(s.binary(), s.Addr, s.password, cmd.Process.Pid, done); err != nil {
		s.Kill()
		if strings.Contains(s.lastLog(), "Address already in use") {
			return fmt.Errorf("%s: %w", s.Addr, errPortInUse)
		}
		return err
	}
	return nil
}

// waitReady polls addr until the program (redis-server or redis-sentinel)
// with process id pid answers PING, the process exits, or readyTimeout passes.
func waitReady(program, addr, password string, pid int, exited <-chan struct{}) error {
	deadline := time.Now().Add(readyTimeout)
	var lastErr error
	for {
		got, err := probe(addr, password)
		switch {
		case err == nil && got == pid:
			return nil
		case err == nil:
			return fmt.Errorf("%s answered as process %d, not %d: %w", addr, got, pid, errPortInUse)
		}
		lastErr = err
		select {
		case <-exited:
			return fmt.Errorf("%s exited before answering on %s", program, addr)
		case <-time.After(pollInterval):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering on %s after %v: %w", program, addr, readyTimeout, lastErr)
		}
	}
}

// probe sends PING and INFO to addr, authenticating first when password is
// set, and returns the process id the server reports.
func probe(addr, password string) (int, error) {
	cmds := [][]string{{"PING"}, {"INFO", "server"}}
	if password != "" {
		cmds = append([][]string{{"AUTH", password}}, cmds...)
	}
	replies, err := roundTrip(addr, cmds...)
	if err != nil {
		return 0, err
	}
	if pong := replies[len(replies)-2]; pong != "PONG" {
		return 0, fmt.Errorf("PING = %q, want PONG", pong)
	}
	pid, ok := infoField(replies[len(replies)-1], "process_id")
	if !ok {
		return 0, errors.New("INFO has no process_id")
	}
	n, err := strconv.Atoi(pid)
	if err != nil {
		return 0, fmt.Errorf("INFO process_id %q: %w", pid, err)
	}
	return n, nil
}

// roundTrip dials addr, sends cmds in one write and reads one simple-string
// or bulk-string reply per command. An error reply ends it with an error.
func roundTrip(addr string, cmds ...[]string) ([]string, error) {
	conn, err := net.DialTimeout("tcp", addr, probeTimeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return nil, err
	}
	var req bytes.Buffer
	for _, cmd := range cmds {
		fmt.Fprintf(&req, "*%d\r\n", len(cmd))
		for _, arg := range cmd {
			fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(arg), arg)
		}
	}
	if _, err := conn.Write(req.Bytes()); err != nil {
		return nil, err
	}
	r := bufio.NewReader(conn)
	replies := make([]string, 0, len(cmds))
	for _, cmd := range cmds {
		reply, err := readReply(r)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd[0], err)
		}
		replies = append(replies, reply)
	}
	return replies, nil
}

// readReply reads one RESP simple string, error or bulk string.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", errors.New("empty reply")
	}
	switch line[0] {
	case '+':
		return line[1:], nil
	case '-':
		return "", fmt.Errorf("server replied %q", line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("bad bulk length %q", line)
		}
		if n < 0 {
			return "", nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		return string(buf[:n]), nil
	default:
		return "", fmt.Errorf("unexpected reply %q", line)
	}
}

// infoField returns the value of name in an INFO or CLUSTER INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && k == name {
			return v, true
		}
	}
	return "", false
}

// freePorts returns n distinct loopback ports that were free a moment ago.
// With bus set, each port's bus port (port+10000) was free too. All
// listeners are held until the end so the ports cannot repeat.
func freePorts(n int, bus bool) ([]int, error) {
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 100*n {
			return nil, fmt.Errorf("no free loopback port found after %d tries", tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("listen on loopback: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if bus {
			if port+busOffset > 65535 {
				continue
			}
			bl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+busOffset)))
			if err != nil {
				continue
			}
			held = append(held, bl)
		}
		ports = append(ports, port)
	}
	return ports, nil
}

// lastLog returns the log written since the last start of s.
func (s *Server) lastLog() string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	log := string(b)
	if i := strings.LastIndex(log, "--- redistest: starting"); i >= 0 {
		log = log[i:]
	}
	return log
}

// logStartFailure prints the log of the failed start through t.Logf.
func (s *Server) logStartFailure(t testing.TB) {
	t.Helper()
	t.Logf("redistest: %s log (%s):\n%s", s.binary(), s.logPath, s.lastLog())
}

// URL returns the server's address as "redis://127.0.0.1:PORT", with the
// password from WithArgs("--requirepass", …) in it if there is one.
func (s *Server) URL() string {
	u := url.URL{Scheme: "redis", Host: s.Addr}
	if s.password != "" {
		u.User = url.UserPassword("", s.password)
	}
	return u.String()
}

// Client returns a client of s that is closed when t ends.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.password})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Do sends one command to s on a connection of its own and returns the
// reply, or nil for a nil reply. Any other error fails t.
func (s *Server) Do(t testing.TB, args ...any) any {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.password})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		t.Fatalf("redistest: Do(%v) on %s: %v", args, s.Addr, err)
	}
	return v
}

// ScriptCalls returns the script calls (EVALSHA, EVAL and FCALL) s has served since it
// started, by INFO commandstats: the round trips of decisions and refunds. (The
// commands a script runs are counted apart, and are no round trips.)
func (s *Server) ScriptCalls(t testing.TB) int64 {
	t.Helper()
	return s.CommandCalls(t, "evalsha", "eval", "fcall", "fcall_ro")
}

// DecisionCalls returns the round trips of decisions and refunds s has served since
// it started: its script calls (ScriptCalls) and the INCRBYs of the fixed_window
// requests that a store decides with no script. (The library's scripts run no
// INCRBY; a counted request that is denied gives its units back with a DECRBY in a
// second round trip, not counted here.)
func (s *Server) DecisionCalls(t testing.TB) int64 {
	t.Helper()
	return s.CommandCalls(t, "evalsha", "eval", "fcall", "fcall_ro", "incrby")
}

// CommandCalls returns how many times s has run the commands named (lower-case, as
// INFO commandstats names them) since it started.
func (s *Server) CommandCalls(t testing.TB, names ...string) int64 {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr, Password: s.password})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	st, err := redisinfo.Read(ctx, c)
	if err != nil {
		t.Fatalf("redistest: on %s: %v", s.Addr, err)
	}
	return int64(st.Sum(func(name string) bool { return slices.Contains(names, name) }).Calls)
}

// Kill sends SIGKILL to the process and waits until it is gone. It does
// nothing if the server is not running.
func (s *Server) Kill() { s.signal(syscall.SIGKILL, 0) }

// Stop asks the process to shut down with SIGTERM and waits until it is
// gone, sending SIGKILL if it takes longer than 5 s. It does nothing if the
// server is not running.
func (s *Server) Stop() { s.signal(syscall.SIGTERM, stopTimeout) }

// signal sends sig to the running process and waits for it to exit, for at
// most grace before SIGKILL when grace is positive.
func (s *Server) signal(sig syscall.Signal, grace time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Signal(sig)
	if grace > 0 {
		select {
		case <-s.done:
		case <-time.After(grace):
			_ = s.cmd.Process.Kill()
		}
	}
	<-s.done
	s.cmd, s.done = nil, nil
}

// Restart starts the server again on the same port, with the same options
// and directory, and waits until it answers. A running server is killed
// first. Data is not kept: there is no persistence. A cluster node keeps its
// nodes.conf and so rejoins its cluster.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	deadline := time.Now().Add(readyTimeout)
	for {
		err := s.spawn()
		if err == nil {
			return
		}
		// The old socket or a client may hold the port for a moment.
		if errors.Is(err, errPortInUse) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			continue
		}
		s.logStartFailure(t)
		t.Fatalf("redistest: restart redis-server on %s: %v", s.Addr, err)
	}
}

// Cluster is a Redis Cluster of three masters, each with the replicas
// WithReplicas asks for (none by default), on loopback.
type Cluster struct {
	// Addrs are the masters' "127.0.0.1:PORT" addresses, as they were when
	// the cluster started, in slot order.
	Addrs []string

	nodes    []*Server // the masters at start, in the order of Addrs
	replicas []*Server // the replicas at start
	all      []*Server // every node, in start order
}

// StartCluster starts three cluster-enabled redis-server processes (and
// their replicas, with WithReplicas), joins them with `redis-cli --cluster
// create`, and waits until every node reports cluster_state:ok with all
// 16384 slots covered and every replica is in sync with its master. The
// processes are killed when t ends.
func StartCluster(t testing.TB, opts ...ClusterOption) *Cluster {
	t.Helper()
	requireBinaries(t, serverBinary, cliBinary)
	var o clusterOptions
	for _, opt := range opts {
		opt(&o)
	}
	if o.replicas < 0 {
		t.Fatalf("redistest: WithReplicas(%d): want at least 0", o.replicas)
	}

	n := clusterSize * (1 + o.replicas)
	nodes := make([]*Server, n)
	for i := range nodes {
		nodes[i] = newServer(t, o.args, true)
	}
	ports, err := freePorts(n, true)
	if err != nil {
		t.Fatalf("redistest: pick cluster ports: %v", err)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, node := range nodes {
		node.setPort(ports[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := node.spawn()
			if errors.Is(err, errPortInUse) {
				err = node.startFresh(true)
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			nodes[i].logStartFailure(t)
			t.Fatalf("redistest: start cluster node %d: %v", i, err)
		}
	}

	c := &Cluster{all: nodes}
	var addrs []string
	for _, node := range nodes {
		addrs = append(addrs, node.Addr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", strconv.Itoa(o.replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, cliBinary, args...).CombinedOutput()
	if err != nil {
		t.Logf("redistest: %s %s:\n%s", cliBinary, strings.Join(args, " "), out)
		t.Fatalf("redistest: create cluster: %v", err)
	}
	if err := c.waitOK(ctx); err != nil {
		t.Fatalf("redistest: cluster on %v: %v", addrs, err)
	}
	if err := c.learnRoles(ctx); err != nil {
		t.Fatalf("redistest: cluster on %v: %v", addrs, err)
	}
	return c
}

// waitOK polls CLUSTER INFO on every node until each sees the whole cluster
// healthy, or ctx ends.
func (c *Cluster) waitOK(ctx context.Context) error {
	want := map[string]string{
		"cluster_state":          "ok",
		"cluster_slots_assigned": strconv.Itoa(clusterSlots),
		"cluster_slots_ok":       strconv.Itoa(clusterSlots),
		"cluster_known_nodes":    strconv.Itoa(len(c.all)),
	}
	for _, node := range c.all {
		for {
			err := checkClusterInfo(node.Addr, want)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: %w", node.Addr, err)
			case <-time.After(pollInterval):
			}
		}
	}
	return nil
}

// checkClusterInfo returns an error unless CLUSTER INFO on addr has every
// field of want.
func checkClusterInfo(addr string, want map[string]string) error {
	replies, err := roundTrip(addr, []string{"CLUSTER", "INFO"})
	if err != nil {
		return err
	}
	for name, value := range want {
		if got, _ := infoField(replies[0], name); got != value {
			return fmt.Errorf("CLUSTER INFO %s = %q, want %q", name, got, value)
		}
	}
	return nil
}

// URL returns the cluster in go-redis ParseClusterURL form:
// "redis://127.0.0.1:P1?addr=127.0.0.1:P2&addr=127.0.0.1:P3".
func (c *Cluster) URL() string {
	var b strings.Builder
	b.WriteString("redis://")
	for i, addr := range c.Addrs {
		switch i {
		case 0:
		case 1:
			b.WriteString("?addr=")
		default:
			b.WriteString("&addr=")
		}
		b.WriteString(addr)
	}
	return b.String()
}

// Client returns a cluster client of c that is closed when t ends.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: append([]string(nil), c.Addrs...)})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Nodes returns the cluster's masters as they were at start, in the order
// of Addrs, so that a test can Kill or Restart one.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// A Target is one Redis topology a test runs on: a standalone server or a
// three-master cluster.
type Target struct {
	Name    string // "standalone" or "cluster"
	URL     string // the store's REDIS_URL for it
	Cluster bool   // whether the store must open it as a cluster
	Client  redis.UniversalClient
}

// Targets starts a standalone server and a three-master cluster, for a test that
// runs on both; their clients are closed when t ends.
func Targets(t testing.TB) []Target {
	t.Helper()
	srv, cl := StartServer(t), StartCluster(t)
	return []Target{{"standalone", srv.URL(), false, srv.Client(t)}, {"cluster", cl.URL(), true, cl.Client(t)}}
}
