package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/scripts/internal/redisproc"
)

// A grind is a redis-server running under callgrind, whose instruction counts are
// zeroed and dumped between workloads.
type grind struct {
	srv *redisproc.Server
	// client talks to the server outside the measurements (INFO, TIME, setup).
	client *redis.Client
	// out is callgrind's output file; its dumps are out.1, out.2, ...
	out   string
	dumps int
	// idle is what the server runs per second when no client sends anything (its
	// cron), subtracted from every measurement.
	idle float64
}

// timeout bounds every command to a server under valgrind, which runs some 50 times
// slower than without it.
const timeout = 30 * time.Second

// startGrind starts redis-server under valgrind --tool=callgrind with args. Valgrind
// makes the server some 50 times slower: it gets a minute to answer.
func startGrind(ctx context.Context, args ...string) (*grind, error) {
	dir, err := os.MkdirTemp("", "tollgate-callgrind-")
	if err != nil {
		return nil, err
	}
	g := &grind{out: filepath.Join(dir, "callgrind.out")}
	g.srv, err = redisproc.StartWith(ctx, "redis-server", redisproc.Options{
		Wrap:  []string{"valgrind", "--tool=callgrind", "--callgrind-out-file=" + g.out, "--dump-line=no"},
		Args:  args,
		Ready: time.Minute,
	})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	g.client = redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(g.srv.URL, "redis://"),
		DialTimeout: timeout, ReadTimeout: timeout, WriteTimeout: timeout, MaxRetries: -1})
	return g, nil
}

// stop stops the server and removes its dumps.
func (g *grind) stop() {
	_ = g.client.Close()
	g.srv.Stop()
	os.RemoveAll(filepath.Dir(g.out))
}

// control runs callgrind_control with flag (-z zeroes the counts, -d dumps them).
func (g *grind) control(ctx context.Context, flag string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	b, err := exec.CommandContext(ctx, "callgrind_control", flag, strconv.Itoa(g.srv.Pid())).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %v: %s", flag, err, strings.TrimSpace(string(b)))
	}
	return nil
}

// dump dumps the counts and returns the instructions (Ir) counted since the last zero.
func (g *grind) dump(ctx context.Context) (int64, error) {
	if err := g.control(ctx, "-d"); err != nil {
		return 0, err
	}
	g.dumps++
	name := g.out + "." + strconv.Itoa(g.dumps)
	f, err := os.Open(name)
	if err != nil {
		return 0, fmt.Errorf("callgrind's dump %d: %w", g.dumps, err)
	}
	defer os.Remove(name)
	defer f.Close()
	return parseTotals(f, "Ir")
}

// A count is what one workload cost the server.
type count struct {
	// ir is the instructions the server ran, less its idle instructions over the
	// same wall time; idle is the part subtracted.
	ir, idle float64
	// made is the work's count (decisions).
	made int
}

// count runs work between a zero and a dump and counts what it cost.
func (g *grind) count(ctx context.Context, work func(context.Context) (int, error)) (count, error) {
	if err := g.control(ctx, "-z"); err != nil {
		return count{}, err
	}
	start := time.Now()
	n, err := work(ctx)
	wall := time.Since(start)
	if err != nil {
		return count{}, err
	}
	ir, err := g.dump(ctx)
	if err != nil {
		return count{}, err
	}
	idle := g.idle * wall.Seconds()
	return count{ir: float64(ir) - idle, idle: idle, made: n}, nil
}

// measureIdle sets g.idle: the instructions per second of the server while nobody
// sends it anything, over d (0: nothing is subtracted).
func (g *grind) measureIdle(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		g.idle = 0
		return nil
	}
	c, err := g.count(ctx, func(context.Context) (int, error) {
		time.Sleep(d)
		return 0, nil
	})
	g.idle = c.ir / d.Seconds()
	return err
}
