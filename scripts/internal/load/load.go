// Package load is the closed-loop load of the developer tools (scripts/bench,
// scripts/bench-erl, scripts/soak): workers that each call an operation back to back,
// a measured window inside the run, and what the window saw: calls, errors, the rate
// and a latency histogram.
//
// A tool starts the workers and lets them warm up; Hold parks them with no call in
// flight while the tool reads whatever it brackets the window with (Redis's INFO, a
// process's CPU time, the heap); Measure opens the window and lets them go; Stop
// closes it and waits for the calls in flight, and the tool reads again:
//
//	run := load.Start(ctx, load.Options{Workers: 8, Clients: 10000}, op)
//	time.Sleep(warmup)
//	run.Hold()
//	before := read()
//	run.Measure()
//	time.Sleep(d)
//	res := run.Stop()
//	after := read()
//
// The readings then bracket exactly the calls the window counts: those that started
// inside it. Without Hold, calls in flight at Measure straddle the first reading.
package load

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// An Op makes one call as worker w for the client at index i (see Options.Clients).
// It is called from Options.Workers goroutines at once; worker w's calls come one
// after another from one goroutine, so state indexed by w needs no lock.
type Op func(ctx context.Context, w, i int) error

// Options say how many workers call and for whom.
type Options struct {
	// Workers is how many goroutines call the op back to back; less than 1 means 1.
	Workers int
	// Clients is how many clients the calls go round: worker w calls for clients w,
	// w+Workers, w+2·Workers, … modulo Clients, so every client is used evenly with no
	// counter the workers share. 0 leaves i unreduced.
	Clients int
}

// A Run is a load in progress, from Start to Stop. Its methods are for the one
// goroutine that started it.
type Run struct {
	measuring, stopping atomic.Bool
	from                time.Time
	wg                  sync.WaitGroup
	workers             []worker
	// holding asks the workers to park; mu and parked (the cond on mu) guard
	// held, how many have, and live, how many have not returned.
	holding    atomic.Bool
	mu         sync.Mutex
	parked     *sync.Cond
	held, live int
	// latency is the result's histogram, made at Start so that Stop allocates next
	// to nothing: a tool that reads the heap after Stop sees the calls' allocations.
	latency *hdrhistogram.Histogram
	result  *Result // once stopped
}

// worker is what one worker counted in the window; only its goroutine writes it
// before Stop.
type worker struct {
	calls, errors int64
	firstErr      error
	latency       *hdrhistogram.Histogram
}

// Start starts the workers. They call op unmeasured until Measure, and until Stop or
// until ctx is done.
func Start(ctx context.Context, o Options, op Op) *Run {
	n := max(1, o.Workers)
	r := &Run{workers: make([]worker, n), latency: NewHistogram(), live: n}
	r.parked = sync.NewCond(&r.mu)
	for w := range r.workers {
		r.workers[w].latency = NewHistogram()
		r.wg.Go(func() { r.work(ctx, o.Clients, w, op) })
	}
	return r
}

func (r *Run) work(ctx context.Context, clients, w int, op Op) {
	me := &r.workers[w]
	n := len(r.workers)
	i := w
	if clients > 0 {
		i %= clients
	}
	defer func() {
		r.mu.Lock()
		r.live--
		r.parked.Broadcast()
		r.mu.Unlock()
	}()
	for !r.stopping.Load() && ctx.Err() == nil {
		if r.holding.Load() {
			r.park()
			continue
		}
		counted := r.measuring.Load()
		t0 := time.Now()
		err := op(ctx, w, i)
		if counted {
			_ = me.latency.RecordValue(int64(time.Since(t0)))
			me.calls++
			if err != nil {
				me.errors++
				if me.firstErr == nil {
					me.firstErr = err
				}
			}
		}
		i += n
		if clients > 0 && i >= clients {
			i %= clients
		}
	}
}

// park waits, counted among the held workers, until Measure or Stop lets it go.
func (r *Run) park() {
	r.mu.Lock()
	r.held++
	r.parked.Broadcast()
	for r.holding.Load() {
		r.parked.Wait()
	}
	r.held--
	r.mu.Unlock()
}

// Hold parks the workers: it returns once every worker has ended its call in flight
// (or returned, its ctx done) and waits for Measure or Stop.
func (r *Run) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.holding.Store(true)
	for r.held < r.live {
		r.parked.Wait()
	}
}

// release lets held workers go.
func (r *Run) release() {
	r.mu.Lock()
	r.holding.Store(false)
	r.parked.Broadcast()
	r.mu.Unlock()
}

// Measure opens the measured window, and lets the workers go if Hold parked them:
// the calls that start from now on count.
func (r *Run) Measure() {
	r.from = time.Now()
	r.measuring.Store(true)
	r.release()
}

// Stop closes the window, stops the workers and waits for their calls in flight.
// Called again, it returns the same result.
func (r *Run) Stop() Result {
	if r.result != nil {
		return *r.result
	}
	r.stopping.Store(true)
	r.release()
	r.wg.Wait()
	res := Result{Elapsed: time.Since(r.from), Latency: r.latency}
	if !r.measuring.Load() {
		res.Elapsed = 0
	}
	for _, w := range r.workers {
		res.Calls += w.calls
		res.Errors += w.errors
		if res.FirstErr == nil {
			res.FirstErr = w.firstErr
		}
		res.Latency.Merge(w.latency)
	}
	r.result = &res
	return res
}

// Result is what a run's window saw.
type Result struct {
	Calls  int64 // calls started in the window
	Errors int64 // of those, the ones that failed
	// FirstErr is the error of a failed call (the first of some worker), or nil.
	FirstErr error
	// Elapsed is from Measure until the workers had stopped, their counted calls ended.
	Elapsed time.Duration
	// Latency holds every counted call's time, in nanoseconds.
	Latency *hdrhistogram.Histogram
}

// Rate is calls per second over the window, or 0 for an empty one.
func (r Result) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Calls) / r.Elapsed.Seconds()
}

// NewHistogram returns an empty latency histogram in nanoseconds, from 100ns to 60s,
// to 3 significant digits.
func NewHistogram() *hdrhistogram.Histogram {
	return hdrhistogram.New(100, int64(60*time.Second), 3)
}

// Median is the middle of xs (the mean of the two middle values when there are an
// even number), or 0 when xs is empty. The tools fold the rounds of a cell with it:
// a round that other work on the machine slowed moves it least.
func Median(xs []float64) float64 {
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
