package rlqs

import (
	"context"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// The demand of every instance: each instance adds the demand of its Envoys on a
// quota (requests per second, in thousandths) to a counter beside the quota's
// key, and takes back what it added when its demand falls, so the counter holds the
// sum of every instance's latest demand; its answer to each change is that sum. The
// counter is an ordinary fixed_window counter, charged and given back through the
// engine like any other, one call per quota, instance and reporting interval (two
// when the demand falls or the counter's window turns). Its window is
// demandWindows reporting intervals: an instance that dies stops counting when the
// window ends, and each instance adds its whole demand again in each new window,
// in the meantime the last window's sum stands in for the new one's.

const (
	// demandWindows is the counter's window, in reporting intervals.
	demandWindows = 4
	// demandCount is the counter's limit, never reached: it only counts.
	demandCount = algo.MaxCount
	// milli scales a demand in requests per second to the counter's units.
	milli = 1000
	// demandSuffix makes the counter's key of a quota's first key.
	demandSuffix = ":rlqs-demand"
)

// demandRule names the counter's limit in the engine's results.
var demandRule = &policy.Rule{Name: "rlqs-demand"}

// board is a share's view of the demand counter.
type board struct {
	plan      engine.Plan // the counter
	period    time.Duration
	window    int64 // the counter's window our publication is in
	published int64 // what this instance added to it in window
	charged   int64 // the store's time of an addition in window, Unix µs
	total     int64 // the counter's sum at the last call
	prevTotal int64 // the sum in the previous window, until interval has passed in this one
	rolled    time.Time
	next      time.Time // when to publish again
}

// newBoard returns the board of a quota whose first key is key.
func newBoard(key string, interval time.Duration) *board {
	period := demandWindows * interval
	return &board{
		period: period,
		plan: engine.Plan{Items: []engine.Item{{
			Key:    key + demandSuffix,
			Meter:  algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: demandCount, Period: period}}},
			Rule:   demandRule,
			Groups: 1,
		}}},
	}
}

// publish adds the change of this instance's demand (requests per second) to the
// counter and reads the sum.
func (b *board) publish(ctx context.Context, eng *engine.Engine, demand float64, now time.Time) error {
	mine := int64(demand * milli)
	delta := mine - b.published
	var v engine.Verdict
	if delta > 0 {
		t, err := eng.Take(ctx, b.plan, delta)
		if err != nil {
			return err
		}
		v = t.Verdict
	} else {
		var err error
		if v, err = eng.Peek(ctx, b.plan); err != nil {
			return err
		}
	}
	if w := v.NowMicros / b.period.Microseconds(); w != b.window {
		// A new window: this instance's whole demand goes in again.
		if b.window != 0 {
			b.prevTotal, b.rolled = b.total, now
		}
		b.window, b.charged = w, v.NowMicros
		added := max(0, delta)
		if mine > added {
			t, err := eng.Take(ctx, b.plan, mine-added)
			if err != nil {
				return err
			}
			v = t.Verdict
		}
		b.published = mine
		b.total = demandCount - v.Limits[0].Remaining
		return nil
	}
	if b.charged == 0 {
		b.charged = v.NowMicros
	}
	b.total = demandCount - v.Limits[0].Remaining
	if delta < 0 {
		if err := eng.GiveBack(ctx, b.plan, -delta, b.charged); err != nil {
			return err
		}
		b.total += delta
	}
	b.published = mine
	return nil
}

// others returns the demand of the other instances, in requests per second, as
// of the last call.
func (b *board) others(now time.Time, interval time.Duration) float64 {
	total := b.total
	if !b.rolled.IsZero() && now.Sub(b.rolled) < interval+interval/2 {
		total = max(total, b.prevTotal)
	}
	return float64(max(0, total-b.published)) / milli
}
