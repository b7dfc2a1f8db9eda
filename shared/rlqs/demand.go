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
// engine like any other, one call per quota, instance and reporting interval, and
// one at each start of the quota's window (two when the demand falls or the
// counter's window turns). An instance whose bucket leaves takes its demand out at
// once.
//
// The counter's window is demandWindows reporting intervals, or the whole quota's
// windows they hold (demandPeriod): an instance that dies stops counting when it
// ends. Each instance adds its whole demand again in each new window, at the
// quota's window start that begins it; until every instance has (standIn), the last
// window's sum stands in for the new one's.

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
	prevTotal int64 // the sum in the previous window, until standIn has passed in this one
	rolled    time.Time
	standIn   time.Duration
	// settled is the other instances' demand as last read outside a stand-in, when
	// every instance had published in the counter's window. It stands in too: after
	// the store was unreachable the previous window's sum may lack instances that
	// could not publish in it, and an instance that saw only itself would take the
	// whole quota at the next window's start.
	settled int64
	next    time.Time // when to publish again
	at      time.Time // when it was last published
}

// demandPeriod is the counter's window for a quota of windows of period reported
// every interval: demandWindows intervals, or when a window is shorter, the whole
// windows they hold, so that the counter's turns fall on the quota's window starts,
// when every instance publishes.
func demandPeriod(interval, period time.Duration) time.Duration {
	if d := demandWindows * interval; period < d {
		return d / period * period
	}
	return demandWindows * interval
}

// newBoard returns the board of a quota whose first key is key, reported every
// interval, of windows of window.
func newBoard(key string, interval, window time.Duration) *board {
	period := demandPeriod(interval, window)
	return &board{
		period: period,
		// Every instance with buckets on the quota publishes at its window's start,
		// within a sweep and the instances' clock difference (ttlMargin) of it; a
		// stand-in shorter than the quota's window leaves the next window's start to
		// the new sum, which a departure published since has left.
		standIn: min(interval+interval/2, window/2),
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
	added := int64(0) // what this call put in the counter
	if delta > 0 {
		t, err := eng.Take(ctx, b.plan, delta)
		if err != nil {
			return err
		}
		v, added = t.Verdict, t.Units
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
		if mine > added {
			t, err := eng.Take(ctx, b.plan, mine-added)
			if err != nil {
				return err
			}
			v, added = t.Verdict, added+t.Units
		}
		// What the counter took, which is less than mine only when it is full: a
		// later fall gives back no more than this instance put in.
		b.published = added
		b.total = demandCount - v.Limits[0].Remaining
		b.settle(now)
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
		b.published = mine
		b.settle(now)
		return nil
	}
	b.published += added
	b.settle(now)
	return nil
}

// standingIn reports whether, at now, the counter's window turned too recently for
// every instance to have published in it.
func (b *board) standingIn(now time.Time) bool {
	return !b.rolled.IsZero() && now.Sub(b.rolled) < b.standIn
}

// settle records the others' demand just read, unless it may be incomplete.
func (b *board) settle(now time.Time) {
	if !b.standingIn(now) {
		b.settled = max(0, b.total-b.published)
	}
}

// others returns the demand of the other instances, in requests per second, as
// of the last call.
func (b *board) others(now time.Time) float64 {
	others := b.total - b.published
	if b.standingIn(now) {
		others = max(others, b.prevTotal-b.published, b.settled)
	}
	return float64(max(0, others)) / milli
}
