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
// as a multiple of the minimal script's, measured by this section on the code before
// the Lua became a Functions library (commit 7ec777e: an EVALSHA of a script that
// defined its functions on every call), the lower of two runs on the 2-CPU machine of
// issue 14. A ratio to the minimal script measured in the same run, not a time, so
// that a busier machine does not move the bar; "no algorithm worse than today"
// compares with it.
var scriptCostBefore = map[string]float64{
	"fixed_window":   2.29,
	"sliding_log":    3.42,
	"sliding_window": 2.22,
	"token_bucket":   3.15,
	"leaky_bucket":   2.45,
	"gcra":           2.25,
	"bucket_ring":    3.72,
}

// scriptOps returns the contenders of the script-cost section: the minimal script,
// redis_rate, and one unbatched tollgate decision (Store.Decide, one limit) of each
// algorithm, each on keys of its own.
func scriptOps(e *env) ([]string, []op, error) {
	ctx := context.Background()
	minimal := redis.NewScript("redis.call('INCRBY', KEYS[1], ARGV[1]) redis.call('PEXPIRE', KEYS[1], ARGV[2]) return 1")
	if err := minimal.Load(ctx, e.client).Err(); err != nil {
		return nil, nil, fmt.Errorf("bench: load the minimal script: %w", err)
	}
	keys := func(prefix string) []string {
		ks := make([]string, len(e.ids))
		for i, id := range e.ids {
			ks[i] = algo.Key("sc:", id, prefix, "", "0")
		}
		return ks
	}
	mk := keys("minimal")
	names := []string{minimalRow, "redis_rate"}
	ops := []op{
		func(ctx context.Context, i int) error {
			return minimal.Run(ctx, e.client, mk[i:i+1], 1, 1000).Err()
		},
	}
	lim := redis_rate.NewLimiter(e.client)
	rk := keys("redis_rate")
	limit := redis_rate.Limit{Rate: 1000000, Burst: 1000000, Period: time.Second}
	ops = append(ops, func(ctx context.Context, i int) error {
		r, err := lim.Allow(ctx, rk[i], limit)
		if err == nil && r.Allowed != 1 {
			err = errors.New("redis_rate denied")
		}
		return err
	})
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
		meters := []algo.Meter{{Limits: []algo.Limit{l}}}
		ks := keys(name)
		names = append(names, "tollgate/"+name)
		ops = append(ops, func(ctx context.Context, i int) error {
			o, err := e.store.Decide(ctx, algo.Check{Keys: ks[i : i+1], Meters: meters, Cost: 1})
			if err == nil && !o.Allowed {
				err = fmt.Errorf("tollgate %s denied", name)
			}
			return err
		})
	}
	return names, ops, nil
}

// measureScriptCost runs n decisions of every script-cost contender per round, the
// contenders interleaved (a different one leads each round), and reports the median
// script time per call of each.
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
			if err := runN(ctx, ops[i], len(e.ids), n); err != nil {
				return nil, fmt.Errorf("bench: script cost %s: %w", names[i], err)
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

// runN makes n decisions one after the other, on clients round robin: with nothing
// else in flight, Redis is not preempted by the bench's own goroutines in the middle
// of a call (commandstats counts wall time), which on two CPUs skews the figures.
func runN(ctx context.Context, o op, clients, n int) error {
	for j := range n {
		if err := o(ctx, j%clients); err != nil {
			return err
		}
	}
	return nil
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
