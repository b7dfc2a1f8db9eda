package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// env is the servers and the stores the workloads run on.
type env struct {
	std     *grind // a standalone redis-server
	cluster *grind // a single-node cluster (nil when no refund is measured)
	// lone sends every request on its own; batch batches (MaxBatch 64); slots is
	// the cluster's store.
	lone, batch, slots *redisstore.Store
}

// refLibrary is the reference rows' function: it returns 1.
const refLibrary = "#!lua name=tollgate_callgrind\nredis.register_function('callgrind_one', function() return 1 end)"

// batchSize is the requests per round trip of the batch path, and its goroutines.
const batchSize = 64

func setup(ctx context.Context, cluster bool, idle time.Duration) (e *env, err error) {
	for _, tool := range []string{"valgrind", "callgrind_control"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found: install valgrind (apt-get install valgrind)", tool)
		}
	}
	e = &env{}
	defer func() {
		if err != nil {
			e.close()
		}
	}()
	fmt.Fprintln(os.Stderr, "starting redis-server under callgrind")
	if e.std, err = startGrind(ctx); err != nil {
		return nil, err
	}
	if e.lone, err = openStore(ctx, e.std, redisstore.Config{}); err != nil {
		return nil, err
	}
	if e.batch, err = openStore(ctx, e.std, redisstore.Config{BatchWait: redisstore.DefaultBatchWait, MaxBatch: batchSize}); err != nil {
		return nil, err
	}
	if err := e.std.client.FunctionLoadReplace(ctx, refLibrary).Err(); err != nil {
		return nil, fmt.Errorf("load the reference function: %w", err)
	}
	if cluster {
		fmt.Fprintln(os.Stderr, "starting a single-node cluster under callgrind")
		if e.cluster, err = startGrind(ctx, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"); err != nil {
			return nil, err
		}
		if err := ownAllSlots(ctx, e.cluster.client); err != nil {
			return nil, err
		}
		if e.slots, err = openStore(ctx, e.cluster, redisstore.Config{Cluster: true}); err != nil {
			return nil, err
		}
	}
	for _, g := range []*grind{e.std, e.cluster} {
		if g == nil {
			continue
		}
		if err := g.measureIdle(ctx, idle); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "idle: %.0f instructions per second\n", g.idle)
	}
	return e, nil
}

func (e *env) close() {
	for _, s := range []*redisstore.Store{e.lone, e.batch, e.slots} {
		if s != nil {
			_ = s.Close()
		}
	}
	for _, g := range []*grind{e.std, e.cluster} {
		if g != nil {
			g.stop()
		}
	}
}

// openStore opens a store on g's server with c's batching, with timeouts that suit a
// server under valgrind, and loads the library.
func openStore(ctx context.Context, g *grind, c redisstore.Config) (*redisstore.Store, error) {
	c.URL, c.Timeout, c.DialTimeout = g.srv.URL, timeout, timeout
	s, err := redisstore.Open(c)
	if err != nil {
		return nil, err
	}
	if err := s.Preload(ctx); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// ownAllSlots gives the node every slot and waits until its cluster is ok.
func ownAllSlots(ctx context.Context, c *redis.Client) error {
	if err := c.ClusterAddSlotsRange(ctx, 0, 16383).Err(); err != nil {
		return fmt.Errorf("CLUSTER ADDSLOTSRANGE: %w", err)
	}
	for deadline := time.Now().Add(time.Minute); ; {
		info, err := c.ClusterInfo(ctx).Result()
		if err == nil && strings.Contains(info, "cluster_state:ok") {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("the single-node cluster is not ok after a minute"), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// awayFromEdge waits, when the server's clock is less than 90s before the end of an
// hour (the limits' period), until the hour has passed, so that a warm-up and its
// measurement fall in one window: the measured decisions find their keys.
func (e *env) awayFromEdge(ctx context.Context) error {
	now, err := e.std.client.Time(ctx).Result()
	if err != nil {
		return err
	}
	if left := now.Truncate(time.Hour).Add(time.Hour).Sub(now); left < 90*time.Second {
		fmt.Fprintf(os.Stderr, "waiting %v for the hour to turn\n", left.Round(time.Second))
		time.Sleep(left + time.Second)
	}
	return nil
}

// A workload is what one cell runs, once to warm up and once measured.
type workload struct {
	g   *grind
	run func(context.Context) (int, error)
}

// workload returns the workload of row on path col, on n clients. A workload that
// measures a denial first exhausts its clients' limits.
func (e *env) workload(ctx context.Context, row, col string, n int) (workload, error) {
	switch row {
	case refERL:
		keys, round := refKeys("erl", n), 0
		return workload{e.std, func(ctx context.Context) (int, error) {
			if col == "new" { // keys no round used before
				round++
				keys = refKeys(fmt.Sprintf("erl-new-%d", round), n)
			}
			for _, k := range keys {
				if err := pipelineErr(e.std.client.Pipelined(ctx, func(p redis.Pipeliner) error {
					p.IncrBy(ctx, k, 1)
					p.Expire(ctx, k, time.Hour)
					return nil
				})); err != nil {
					return 0, err
				}
			}
			return len(keys), nil
		}}, nil
	case refFCall:
		keys := refKeys("fcall", n)
		return workload{e.std, func(ctx context.Context) (int, error) {
			for _, k := range keys {
				if err := e.std.client.FCall(ctx, "callgrind_one", []string{k}).Err(); err != nil {
					return 0, err
				}
			}
			return len(keys), nil
		}}, nil
	}
	a := algo.Algorithm(row)
	high, low := meterOf(a, 1_000_000), meterOf(a, 1)
	if a == algo.SlidingLog {
		high = meterOf(a, algo.MaxLogCount)
	}
	key := func(i int, tag string) string {
		return algo.Key("callgrind:", fmt.Sprintf("c%06d%s", i, tag), row+"-"+col, "", "0")
	}
	checks := make([]algo.Check, n)
	for i := range checks {
		checks[i] = algo.Check{Keys: []string{key(i, "")}, Meters: []algo.Meter{high}, Cost: 1}
	}
	w := workload{g: e.std}
	switch col {
	case "lone":
		w.run = decider(e.lone, checks, 1, true)
	case "new":
		round := 0
		w.run = func(ctx context.Context) (int, error) {
			round++ // keys no round used before
			for i := range checks {
				checks[i].Keys = []string{key(i, fmt.Sprintf("-new%d", round))}
			}
			return decider(e.lone, checks, 1, true)(ctx)
		}
	case "batch":
		w.run = many(e.lone, checks)
	case "batched":
		w.run = decider(e.batch, checks, batchSize, true)
	case "two":
		for i := range checks {
			checks[i].Keys = append(checks[i].Keys, algo.Key("callgrind:", fmt.Sprintf("c%06d", i), row+"-"+col, "", "1"))
			checks[i].Meters = append(checks[i].Meters, high)
		}
		w.run = decider(e.lone, checks, 1, true)
	case "denied":
		for i := range checks {
			checks[i].Meters = []algo.Meter{low}
		}
		if _, err := decider(e.lone, checks, 1, true)(ctx); err != nil {
			return w, fmt.Errorf("%s/%s: exhaust the limits: %w", row, col, err)
		}
		w.run = decider(e.lone, checks, 1, false)
	case "refund":
		if e.slots == nil {
			return w, errors.New("refund: no cluster")
		}
		exhaust := make([]algo.Check, n)
		for i := range checks {
			ka, kb := key(i, "-a"), key(i, "-b")
			for j := 0; algo.Slot(ka) == algo.Slot(kb); j++ {
				kb = key(i, fmt.Sprintf("-b%d", j))
			}
			exhaust[i] = algo.Check{Keys: []string{kb}, Meters: []algo.Meter{low}, Cost: 1}
			checks[i] = algo.Check{Keys: []string{ka, kb}, Meters: []algo.Meter{high, low}, Cost: 1}
		}
		if _, err := decider(e.slots, exhaust, 1, true)(ctx); err != nil {
			return w, fmt.Errorf("%s/%s: exhaust the second slot's limits: %w", row, col, err)
		}
		w.g, w.run = e.cluster, decider(e.slots, checks, 1, false)
	case "settle":
		for i := range checks {
			checks[i].Settle = true
		}
		w.run = decider(e.lone, checks, 1, true)
	default:
		return w, fmt.Errorf("unknown path %q", col)
	}
	return w, nil
}

// meterOf returns a one-limit meter of algorithm a admitting count units per hour: a
// burst of count where the algorithm takes one, and a ring of ten buckets for
// bucket_ring.
func meterOf(a algo.Algorithm, count int64) algo.Meter {
	l := algo.Limit{Algorithm: a, Count: count, Period: time.Hour}
	if a.HasBurst() {
		l.Burst = count
	}
	if a == algo.BucketRing {
		l.Bucket = l.Period / 10
	}
	return algo.Meter{Limits: []algo.Limit{l}}
}

func refKeys(name string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("callgrind:ref:%s:c%06d", name, i)
	}
	return keys
}

// decider returns a run that decides every check once on s, from workers goroutines
// (1: one after the other), requires each outcome's Allowed to be allowed, and
// returns the decisions made.
func decider(s *redisstore.Store, checks []algo.Check, workers int, allowed bool) func(context.Context) (int, error) {
	return func(ctx context.Context) (int, error) {
		var next, made atomic.Int64
		var wg sync.WaitGroup
		errs := make([]error, workers)
		for w := range workers {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= len(checks) {
						return
					}
					out, err := decideOne(ctx, s, checks[i])
					if err == nil && out.Allowed != allowed {
						err = fmt.Errorf("%w: %v: allowed %v, want %v", errUnexpected, checks[i].Keys, out.Allowed, allowed)
					}
					if err != nil {
						errs[w] = err
						return
					}
					made.Add(1)
				}
			})
		}
		wg.Wait()
		return int(made.Load()), errors.Join(errs...)
	}
}

// many returns a run that decides the checks batchSize at a time, each batch in one
// call of the library's many entry on s's client, as a batching store sends a full
// batch (algo.ManyCall), and requires every request to be allowed.
func many(s *redisstore.Store, checks []algo.Check) func(context.Context) (int, error) {
	fn := algo.Lua().Function(algo.EntryMany)
	return func(ctx context.Context) (int, error) {
		made := 0
		for batch := range slices.Chunk(checks, batchSize) {
			now := time.Now().UnixMicro()
			for i := range batch {
				batch[i] = batch[i].AtWindows(now) // as Decide does before batching
			}
			keys, args := algo.ManyCall(batch)
			v, err := s.Client().FCall(ctx, fn, keys, args...).Result()
			if err != nil {
				return made, err
			}
			reps, ok := v.([]any)
			if !ok || len(reps) != len(batch) {
				return made, fmt.Errorf("%w: many's reply is %T, want %d replies", errUnexpected, v, len(batch))
			}
			for i, r := range reps {
				rep, err := algo.ParseDecideReply(r, batch[i].Meters)
				if err == nil && !rep.Allowed {
					err = fmt.Errorf("%w: %v: denied, want allowed", errUnexpected, batch[i].Keys)
				}
				if err != nil {
					return made, err
				}
				made++
			}
		}
		return made, nil
	}
}

func decideOne(ctx context.Context, s *redisstore.Store, c algo.Check) (algo.Outcome, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.Decide(ctx, c)
}

var errUnexpected = errors.New("unexpected outcome")

// pipelineErr is the first error of a pipeline's commands, or of the pipeline.
func pipelineErr(cmds []redis.Cmder, err error) error {
	if err != nil {
		return err
	}
	for _, c := range cmds {
		if c.Err() != nil {
			return c.Err()
		}
	}
	return nil
}
