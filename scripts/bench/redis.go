package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server process the bench started on a loopback port.
type redisServer struct {
	URL  string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
}

// startRedis starts binary on a free loopback port, without persistence, in a
// temporary directory, and waits until it answers PING.
func startRedis(ctx context.Context, binary string) (*redisServer, error) {
	path, err := exec.LookPath(binary)
	if err != nil {
		return nil, fmt.Errorf("bench: %s not found; install it (apt-get install redis-server) or set REDIS_URL", binary)
	}
	dir, err := os.MkdirTemp("", "tollgate-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	var lastErr error
	for range 5 {
		port, err := freePort()
		if err != nil {
			lastErr = err
			continue
		}
		cmd := exec.Command(path, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "yes",
			"--logfile", dir+"/redis.log")
		cmd.SysProcAttr = procAttr()
		if err := cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("bench: start %s: %w", path, err)
		}
		s := &redisServer{URL: "redis://127.0.0.1:" + strconv.Itoa(port), cmd: cmd, dir: dir, done: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(s.done) }()
		if err := s.waitReady(ctx); err != nil {
			lastErr = err
			s.kill()
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("bench: redis-server did not start: %w", lastErr)
}

func (s *redisServer) waitReady(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(s.URL, "redis://"), MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
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
func (s *redisServer) Stop() {
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

func (s *redisServer) kill() {
	_ = s.cmd.Process.Kill()
	<-s.done
}

func freePort() (int, error) {
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
