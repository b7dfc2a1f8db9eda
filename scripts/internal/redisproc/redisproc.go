// Package redisproc runs redis-server processes on loopback for the bench, the soak
// and the callgrind measurement: started on a free port without persistence (under a
// wrapper such as valgrind, when asked), restarted on the same port.
package redisproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started on a loopback port.
type Server struct {
	URL  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}

	path string
	port int
	opts Options
}

// Options change how Start runs the server. The zero value runs redis-server itself
// and waits 5s for it.
type Options struct {
	// Wrap is a command that runs redis-server, with its arguments (e.g. valgrind
	// --tool=callgrind): the server is started as Wrap followed by its own command.
	Wrap []string
	// Args are more redis-server arguments (e.g. --cluster-enabled yes).
	Args []string
	// Ready is how long the server may take to answer its first PING (default 5s; a
	// server under valgrind needs far longer).
	Ready time.Duration
}

// Start starts binary on a free loopback port, without persistence, in a temporary
// directory, and waits until it answers PING.
func Start(ctx context.Context, binary string) (*Server, error) {
	return StartWith(ctx, binary, Options{})
}

// StartWith starts binary as Start does, with o.
func StartWith(ctx context.Context, binary string, o Options) (*Server, error) {
	if o.Ready <= 0 {
		o.Ready = 5 * time.Second
	}
	path, err := exec.LookPath(binary)
	if err != nil {
		return nil, fmt.Errorf("redisproc: %s not found; install it (apt-get install redis-server) or set REDIS_URL", binary)
	}
	dir, err := os.MkdirTemp("", "tollgate-redis-")
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	var lastErr error
	for range 5 {
		port, err := FreePort()
		if err != nil {
			lastErr = err
			continue
		}
		s := &Server{URL: "redis://127.0.0.1:" + strconv.Itoa(port), dir: dir, path: path, port: port, opts: o}
		if err := s.spawn(ctx); err != nil {
			lastErr = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redisproc: redis-server did not start: %w", lastErr)
}

// spawn starts the process on s's port and waits until it answers.
func (s *Server) spawn(ctx context.Context) error {
	args := append([]string{s.path, "--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir, "--protected-mode", "yes",
		"--logfile", s.dir + "/redis.log"}, s.opts.Args...)
	args = append(slices.Clone(s.opts.Wrap), args...)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("redisproc: start %s: %w", args[0], err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.done) }()
	if err := s.waitReady(ctx); err != nil {
		s.kill()
		return err
	}
	return nil
}

// Pid returns the server's process id (the wrapper's, which is the server's under
// valgrind: valgrind runs the program in its own process).
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Dir returns the server's working directory (its --dir), which Stop removes.
func (s *Server) Dir() string { return s.dir }

// Restart kills the server (SIGKILL: its data is lost) and starts it again on the
// same port.
func (s *Server) Restart(ctx context.Context) error {
	s.kill()
	return s.spawn(ctx)
}

func (s *Server) waitReady(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(s.URL, "redis://"), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(s.opts.Ready)
	for {
		select {
		case <-s.done:
			log, _ := os.ReadFile(s.dir + "/redis.log")
			return fmt.Errorf("redis-server exited: %s", lastLines(string(log), 5))
		default:
		}
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := c.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return errors.Join(err, ctx.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 5s), waits for it and
// removes its directory. It is safe to call more than once.
func (s *Server) Stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		s.kill()
	}
	os.RemoveAll(s.dir)
}

func (s *Server) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
