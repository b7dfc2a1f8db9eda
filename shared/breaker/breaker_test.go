package breaker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// step is one action on a breaker and what the test expects of it.
type step struct {
	advance  time.Duration // move the clock first
	probeNow bool          // then call ProbeNow
	result   Result        // result of the call when let through
	allowed  bool          // want the call let through
	state    State         // want the state after the call
}

func TestBreakerSteps(t *testing.T) {
	s := Settings{Failures: 2, FirstProbe: 100 * time.Millisecond, OpenFor: 350 * time.Millisecond}
	tests := []struct {
		name  string
		steps []step
	}{
		{"successes keep it closed", []step{
			{result: Success, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Closed},
			{result: Success, allowed: true, state: Closed}, // a success resets the run
			{result: Failure, allowed: true, state: Closed},
		}},
		{"consecutive failures open it", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{result: Success, allowed: false, state: Open},
			{advance: 99 * time.Millisecond, result: Success, allowed: false, state: Open},
		}},
		{"first probe after FirstProbe closes it", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Success, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Closed}, // the run starts again
		}},
		{"failed probes double the wait up to OpenFor", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Failure, allowed: true, state: Open}, // waits 200ms
			{advance: 199 * time.Millisecond, result: Success, allowed: false, state: Open},
			{advance: time.Millisecond, result: Failure, allowed: true, state: Open}, // waits 350ms, not 400
			{advance: 349 * time.Millisecond, result: Success, allowed: false, state: Open},
			{advance: time.Millisecond, result: Failure, allowed: true, state: Open}, // 350ms again
			{advance: 350 * time.Millisecond, result: Success, allowed: true, state: Closed},
		}},
		{"the wait starts short again after a recovery", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Failure, allowed: true, state: Open},
			{advance: 200 * time.Millisecond, result: Success, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Success, allowed: true, state: Closed},
		}},
		{"an ignored probe lets the next call probe", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Ignore, allowed: true, state: HalfOpen},
			{result: Success, allowed: true, state: Closed},
		}},
		{"ProbeNow ends the wait and restarts the backoff", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
			{advance: 100 * time.Millisecond, result: Failure, allowed: true, state: Open}, // waits 200ms
			{advance: 200 * time.Millisecond, result: Failure, allowed: true, state: Open}, // waits 350ms
			{advance: 10 * time.Millisecond, result: Failure, allowed: false, state: Open},
			{probeNow: true, result: Failure, allowed: true, state: Open}, // waits 100ms, not 350ms
			{advance: 99 * time.Millisecond, result: Success, allowed: false, state: Open},
			{advance: time.Millisecond, result: Failure, allowed: true, state: Open}, // waits 200ms
			{advance: 199 * time.Millisecond, result: Success, allowed: false, state: Open},
			{probeNow: true, result: Success, allowed: true, state: Closed},
		}},
		{"ProbeNow leaves a closed breaker and its failures alone", []step{
			{result: Failure, allowed: true, state: Closed},
			{probeNow: true, result: Failure, allowed: true, state: Open},
			{probeNow: true, advance: time.Millisecond, result: Success, allowed: true, state: Closed},
		}},
		{"ignored calls do not count", []step{
			{result: Failure, allowed: true, state: Closed},
			{result: Ignore, allowed: true, state: Closed},
			{result: Failure, allowed: true, state: Open},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clk := &fakeClock{now: time.Unix(1000, 0)}
			st := s
			st.Clock = clk.Now
			b := New("n", st)
			for i, sp := range tt.steps {
				clk.Add(sp.advance)
				if sp.probeNow {
					b.ProbeNow()
				}
				p, err := b.Allow()
				if got := err == nil; got != sp.allowed {
					t.Fatalf("step %d: Allow() error = %v, want allowed %v", i, err, sp.allowed)
				}
				if err != nil && !errors.Is(err, ErrOpen) {
					t.Fatalf("step %d: Allow() error = %v, want ErrOpen", i, err)
				}
				p.Done(sp.result)
				if got := b.State(); got != sp.state {
					t.Fatalf("step %d: State() = %v, want %v", i, got, sp.state)
				}
			}
		})
	}
}

func TestBreakerOneProbeAtATime(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := New("n", Settings{Failures: 1, FirstProbe: 10 * time.Millisecond, Clock: clk.Now})
	p, _ := b.Allow()
	p.Done(Failure)
	clk.Add(10 * time.Millisecond)
	probe, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow() after the wait = %v, want the probe", err)
	}
	if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Errorf("Allow() beside the probe = %v, want ErrOpen", err)
	}
	if got := b.State(); got != HalfOpen {
		t.Errorf("State() with the probe in flight = %v, want half-open", got)
	}
	probe.Done(Success)
	if got := b.State(); got != Closed {
		t.Errorf("State() after the probe succeeded = %v, want closed", got)
	}
}

// TestBreakerProbeNowHalfOpen calls ProbeNow while a probe, perhaps to the old node,
// is in flight: the probe still decides, and when it fails the next one waits
// FirstProbe rather than twice the wait before it.
func TestBreakerProbeNowHalfOpen(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	b := New("n", Settings{Failures: 1, FirstProbe: 100 * time.Millisecond, OpenFor: time.Second, Clock: clk.Now})
	p, _ := b.Allow()
	p.Done(Failure)
	for _, wait := range []time.Duration{100 * time.Millisecond, 200 * time.Millisecond} { // grow the wait to 400ms
		clk.Add(wait)
		p, _ = b.Allow()
		p.Done(Failure)
	}
	clk.Add(400 * time.Millisecond)
	probe, err := b.Allow()
	if err != nil {
		t.Fatalf("Allow() after the wait = %v, want the probe", err)
	}
	b.ProbeNow()
	if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Errorf("Allow() beside the probe after ProbeNow = %v, want ErrOpen", err)
	}
	probe.Done(Failure)
	clk.Add(99 * time.Millisecond)
	if _, err := b.Allow(); !errors.Is(err, ErrOpen) {
		t.Errorf("Allow() 99ms after the failed probe = %v, want ErrOpen", err)
	}
	clk.Add(time.Millisecond)
	if _, err := b.Allow(); err != nil {
		t.Errorf("Allow() 100ms after the failed probe = %v, want the probe", err)
	}
}

func TestBreakerStalePermit(t *testing.T) {
	b := New("n", Settings{Failures: 1, FirstProbe: time.Hour})
	early, _ := b.Allow()
	p, _ := b.Allow()
	p.Done(Failure) // opens it
	early.Done(Success)
	if got := b.State(); got != Open {
		t.Errorf("State() after a success of a call let through before it opened = %v, want open", got)
	}
}

func TestBreakerOnChange(t *testing.T) {
	clk := &fakeClock{now: time.Unix(1000, 0)}
	var got []string
	var mu sync.Mutex
	set := NewSet(Settings{Failures: 1, FirstProbe: time.Millisecond, Clock: clk.Now, OnChange: func(n string, from, to State) {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, fmt.Sprintf("%s:%v>%v", n, from, to))
	}})
	b := set.Get("a")
	if set.Get("a") != b {
		t.Fatal("Get(a) twice returned two breakers")
	}
	p, _ := b.Allow()
	p.Done(Failure)
	clk.Add(time.Millisecond)
	p, _ = b.Allow()
	p.Done(Success)
	want := []string{"a:closed>closed", "a:closed>open", "a:open>half-open", "a:half-open>closed"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("OnChange calls = %v, want %v", got, want)
	}
}

func TestSetStatesAndRetain(t *testing.T) {
	var removed []string
	set := NewSet(Settings{Failures: 1, OnRemove: func(n string) { removed = append(removed, n) }})
	for _, n := range []string{"c", "a", "b"} {
		set.Get(n)
	}
	p, _ := set.Get("b").Allow()
	p.Done(Failure)
	if got, want := fmt.Sprint(set.States()), "[{a closed <nil>} {b open <nil>} {c closed <nil>}]"; got != want {
		t.Errorf("States() = %s, want %s", got, want)
	}
	if got := Worst(set.States()); got != Open {
		t.Errorf("Worst() = %v, want open", got)
	}
	set.Retain([]string{"a", "c"})
	if fmt.Sprint(removed) != "[b]" {
		t.Errorf("OnRemove calls = %v, want [b]", removed)
	}
	if got := Worst(set.States()); got != Closed {
		t.Errorf("Worst() after dropping b = %v, want closed", got)
	}
	if got := len(set.States()); got != 2 {
		t.Errorf("len(States()) after Retain = %d, want 2", got)
	}
}

func TestResultOf(t *testing.T) {
	tests := []struct {
		err  error
		want Result
	}{
		{nil, Success},
		{fmt.Errorf("run: %w", context.Canceled), Ignore},
		{context.DeadlineExceeded, Failure},
		{errors.New("dial tcp: connection refused"), Failure},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.err), func(t *testing.T) {
			if got := ResultOf(tt.err); got != tt.want {
				t.Errorf("ResultOf(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestDefaults(t *testing.T) {
	tests := []struct {
		in                 Settings
		failures           int
		firstProbe, capped time.Duration
	}{
		{Settings{}, DefaultFailures, DefaultFirstProbe, DefaultOpenFor},
		{Settings{OpenFor: 50 * time.Millisecond}, DefaultFailures, 50 * time.Millisecond, 50 * time.Millisecond},
		{Settings{Failures: 3, FirstProbe: time.Second, OpenFor: 2 * time.Second}, 3, time.Second, 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.in.Failures, tt.in.FirstProbe, tt.in.OpenFor), func(t *testing.T) {
			s := tt.in.withDefaults()
			if s.Failures != tt.failures || s.FirstProbe != tt.firstProbe || s.OpenFor != tt.capped {
				t.Errorf("withDefaults() = %d, %v, %v; want %d, %v, %v", s.Failures, s.FirstProbe, s.OpenFor, tt.failures, tt.firstProbe, tt.capped)
			}
		})
	}
}

// TestBreakerConcurrent runs calls from many goroutines while the node flips between
// failing and healthy, for the race detector, and checks that the breaker ends closed
// once every call succeeds.
func TestBreakerConcurrent(t *testing.T) {
	b := New("n", Settings{Failures: 3, FirstProbe: time.Microsecond, OpenFor: 10 * time.Microsecond})
	var failing atomic.Bool
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				if g == 0 && i%100 == 0 {
					failing.Store(!failing.Load())
				}
				p, err := b.Allow()
				if err != nil {
					continue
				}
				if failing.Load() {
					p.Done(Failure)
				} else {
					p.Done(Success)
				}
			}
		})
	}
	wg.Wait()
	failing.Store(false)
	deadline := time.Now().Add(time.Second)
	for b.State() != Closed && time.Now().Before(deadline) {
		if p, err := b.Allow(); err == nil {
			p.Done(Success)
		}
	}
	if got := b.State(); got != Closed {
		t.Errorf("State() after successes = %v, want closed", got)
	}
}
