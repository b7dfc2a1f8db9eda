package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// scriptRow is what Redis itself spends on one unbatched decision of one contender:
// the script time of INFO commandstats (EVAL, EVALSHA, FCALL and FCALL_RO), per call,
// the median over the rounds.
type scriptRow struct {
	Name string `json:"name"`
	// CallsPerOp is script calls per decision (1 for every contender here).
	CallsPerOp float64 `json:"calls_per_decision"`
	// UsecPerCall is commandstats' usec per call: the script's own time in Redis.
	UsecPerCall float64 `json:"usec_per_call"`
}

// minimalRow names the floor of the script-cost section: a script of fixed_window's
// commands alone, INCRBY + PEXPIRE, with nothing decided.
const minimalRow = "minimal: INCRBY + PEXPIRE"

// scriptCostBefore is each tollgate algorithm's script time per unbatched decision
// as a multiple of the minimal script's, measured the way this section measures (in
// pipelines of 100, interleaved, the median of seven rounds) on the code before the
// Lua became a Functions library: commit 7ec777e, an EVALSHA of a script that
// decided gcra, leaky_bucket, fixed_window, token_bucket and sliding_window in flat
// code before it defined any function, and the others after defining them all. A
// ratio to the minimal script of the same run, not a time, so that a busier machine
// does not move the bar; "no algorithm worse than today" compares with it.
var scriptCostBefore = map[string]float64{
	"fixed_window":   2.79,
	"sliding_log":    4.23,
	"sliding_window": 3.23,
	"token_bucket":   2.81,
	"leaky_bucket":   2.65,
	"gcra":           2.54,
	"bucket_ring":    4.45,
}

// A scriptOp queues one call of a contender, for the client at index i, on pipe.
type scriptOp func(ctx context.Context, pipe redis.Pipeliner, i int)

// scriptOps returns the contenders of the script-cost section: the minimal script,
// redis_rate's script with the arguments its Allow sends, and the FCALL that an
// unbatched tollgate decision of one limit sends, per algorithm; each on keys of its
// own.
func scriptOps(e *env) ([]string, []scriptOp, error) {
	ctx := context.Background()
	keys := func(prefix string) []string {
		ks := make([]string, len(e.ids))
		for i, id := range e.ids {
			ks[i] = algo.Key("sc:", id, prefix, "", "0")
		}
		return ks
	}
	minimal := redis.NewScript("redis.call('INCRBY', KEYS[1], ARGV[1]) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1")
	rr, err := redisRateCall()
	if err != nil {
		return nil, nil, err
	}
	for _, sc := range []*redis.Script{minimal, rr.script} {
		if err := sc.Load(ctx, e.client).Err(); err != nil {
			return nil, nil, fmt.Errorf("bench: load a script: %w", err)
		}
	}
	mk, rk := keys("minimal"), keys("redis_rate")
	names := []string{minimalRow, "redis_rate"}
	ops := []scriptOp{
		func(ctx context.Context, pipe redis.Pipeliner, i int) {
			minimal.EvalSha(ctx, pipe, mk[i:i+1], 1, 1000)
		},
		func(ctx context.Context, pipe redis.Pipeliner, i int) {
			rr.script.EvalSha(ctx, pipe, rk[i:i+1], rr.args...)
		},
	}
	decide := algo.Lua().Function(algo.EntryDecide)
	for _, name := range algoNames() {
		a := algo.Algorithm(name)
		l := algo.Limit{Algorithm: a, Count: 1000000, Period: time.Second}
		if a == algo.SlidingLog {
			l.Count = algo.MaxLogCount
		}
		if a.HasBurst() {
			l.Burst = l.Count
		}
		if a == algo.BucketRing {
			l.Bucket = 100 * time.Millisecond
		}
		args := algo.DecideArgs([]algo.Meter{{Limits: []algo.Limit{l}}}, 1, 0, false)
		ks := keys(name)
		names = append(names, "tollgate/"+name)
		ops = append(ops, func(ctx context.Context, pipe redis.Pipeliner, i int) {
			pipe.FCall(ctx, decide, ks[i:i+1], args...)
		})
	}
	return names, ops, nil
}

// rrCall is what redis_rate's Allow sends: its script and its arguments.
type rrCall struct {
	script *redis.Script
	args   []any
}

// redisRateCall asks redis_rate for one Allow on a client that answers every EVALSHA
// with NOSCRIPT, so that go-redis falls back to EVAL with the script's source, which
// the client keeps: the bench runs redis_rate's own script, not a copy.
func redisRateCall() (rrCall, error) {
	var rec scriptRecorder
	lim := redis_rate.NewLimiter(&rec)
	if _, err := lim.Allow(context.Background(), "k", redis_rate.Limit{Rate: 1000000, Burst: 1000000, Period: time.Second}); err != nil {
		return rrCall{}, fmt.Errorf("bench: record redis_rate's script: %w", err)
	}
	if rec.src == "" {
		return rrCall{}, errors.New("bench: redis_rate sent no script")
	}
	return rrCall{script: redis.NewScript(rec.src), args: rec.args}, nil
}

// scriptRecorder is a client that keeps the script and arguments of an EVAL.
type scriptRecorder struct {
	redis.UniversalClient // nil: redis_rate's Allow calls only EvalSha and Eval
	src                   string
	args                  []any
}

func (r *scriptRecorder) EvalSha(ctx context.Context, _ string, _ []string, _ ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(redis.ErrNoScript)
	return cmd
}

func (r *scriptRecorder) Eval(ctx context.Context, src string, _ []string, args ...any) *redis.Cmd {
	r.src, r.args = src, args
	cmd := redis.NewCmd(ctx)
	cmd.SetVal([]any{int64(1), int64(0), "-1", "0"})
	return cmd
}

// measureScriptCost sends n calls of every script-cost contender per round, in
// pipelines of 100 (Redis runs them back to back, and the bench's own time stays out
// of the figures), the contenders interleaved (a different one leads each round), and
// reports the median script time per call of each.
func measureScriptCost(ctx context.Context, e *env, n, rounds int, step func(string)) ([]scriptRow, error) {
	names, ops, err := scriptOps(e)
	if err != nil {
		return nil, err
	}
	usec := make([][]float64, len(ops))
	calls := make([]float64, len(ops))
	for r := range rounds {
		for k := range ops {
			i := (k + r) % len(ops)
			step(fmt.Sprintf("script cost %s round %d/%d", names[i], r+1, rounds))
			before, err := readRedisStats(ctx, e.client)
			if err != nil {
				return nil, err
			}
			for from := 0; from < n; from += 100 {
				pipe := e.client.Pipeline()
				for j := from; j < min(from+100, n); j++ {
					ops[i](ctx, pipe, j%len(e.ids))
				}
				if _, err := pipe.Exec(ctx); err != nil {
					return nil, fmt.Errorf("bench: script cost %s: %w", names[i], err)
				}
			}
			after, err := readRedisStats(ctx, e.client)
			if err != nil {
				return nil, err
			}
			dc := after.calls - before.calls
			if dc > 0 {
				usec[i] = append(usec[i], (after.usec-before.usec)/dc)
			}
			calls[i] += dc / float64(n)
		}
	}
	rows := make([]scriptRow, len(ops))
	for i := range ops {
		rows[i] = scriptRow{Name: names[i], CallsPerOp: calls[i] / float64(rounds), UsecPerCall: median(usec[i])}
	}
	return rows, nil
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func (r *results) scriptRow(name string) *scriptRow {
	for i := range r.Script {
		if r.Script[i].Name == name {
			return &r.Script[i]
		}
	}
	return nil
}

// scriptTargets evaluates issue 14's goals on Redis's time per decision: fixed_window
// at most 1.5× the minimal script of its commands, gcra at most redis_rate's, and no
// algorithm worse than before the Functions library (scriptCostBefore).
func (r *results) scriptTargets() []target {
	if len(r.Script) == 0 {
		return nil
	}
	var ts []target
	us := func(name string) float64 {
		if row := r.scriptRow(name); row != nil && row.UsecPerCall > 0 {
			return row.UsecPerCall
		}
		return 0
	}
	fw, floor := us("tollgate/fixed_window"), us(minimalRow)
	ts = append(ts, target{
		Goal:     "script time of an unbatched fixed_window decision ≤ 1.5× a minimal INCRBY + PEXPIRE script",
		Measured: fmt.Sprintf("%s µs vs %s µs: %s×", f2(fw), f2(floor), f2(fw/floor)),
		Status:   status(fw <= 1.5*floor, fw > 0 && floor > 0),
	})
	g, rr := us("tollgate/gcra"), us("redis_rate")
	ts = append(ts, target{
		Goal:     "script time of an unbatched gcra decision ≤ redis_rate's",
		Measured: fmt.Sprintf("%s µs vs %s µs: %s×", f2(g), f2(rr), f2(g/rr)),
		Status:   status(g <= rr, g > 0 && rr > 0),
	})
	for _, name := range algoNames() {
		now, before := us("tollgate/"+name)/floor, scriptCostBefore[name]
		ts = append(ts, target{
			Goal:     fmt.Sprintf("script time of an unbatched %s decision ≤ before (%s× the minimal script at 7ec777e)", name, f2(before)),
			Measured: fmt.Sprintf("%s× the minimal script", f2(now)),
			Status:   status(now <= before, now > 0 && before > 0),
		})
	}
	return ts
}
