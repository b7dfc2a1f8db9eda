// Package breaker implements the circuit breakers that keep a failing Redis node from
// costing a timeout per request: a breaker opens after a run of consecutive failures,
// and then lets one probe through after a wait that starts short and doubles after
// each failed probe, up to a cap. A short outage so costs about as long as it lasts,
// and a long one costs one probe per cap. A Set holds one breaker per node.
package breaker

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ErrOpen is the error of a call the breaker did not let through.
var ErrOpen = errors.New("circuit breaker is open")

// State is a breaker's state.
type State int

// The states of a breaker. Closed lets every call through; Open lets none through until
// its wait is over; HalfOpen has one probe in flight and lets no other call through.
const (
	Closed State = iota
	HalfOpen
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	default:
		return "open"
	}
}

// Result is what a call that was let through tells its breaker.
type Result int

// Results of a call. Ignore counts neither way (the caller went away).
const (
	Success Result = iota
	Failure
	Ignore
)

// ResultOf is the result of a call that returned err: Success for nil, Ignore for a
// cancelled context (a caller that went away is no sign of a sick node), Failure for
// anything else.
func ResultOf(err error) Result {
	switch {
	case err == nil:
		return Success
	case errors.Is(err, context.Canceled):
		return Ignore
	}
	return Failure
}

// Defaults of Settings.
const (
	DefaultFailures   = 5
	DefaultFirstProbe = 200 * time.Millisecond
	DefaultOpenFor    = 5 * time.Second
)

// Settings configure a breaker. The zero value of each field takes its default.
type Settings struct {
	// Failures is how many consecutive failures open the breaker (default 5).
	Failures int
	// FirstProbe is the wait from opening to the first probe (default 200ms, at most
	// OpenFor). Each failed probe doubles the wait.
	FirstProbe time.Duration
	// OpenFor caps the wait between probes (default 5s).
	OpenFor time.Duration
	// OnChange, when set, is called with a breaker's name and its old and new state
	// on every change, and with Closed, Closed when a Set creates a breaker. It is
	// called without the breaker's lock held, and must not block.
	OnChange func(name string, from, to State)
	// OnRemove, when set, is called with the name of each breaker a Set drops.
	OnRemove func(name string)
	// Clock reads the time (default time.Now).
	Clock func() time.Time
}

func (s Settings) withDefaults() Settings {
	if s.Failures <= 0 {
		s.Failures = DefaultFailures
	}
	if s.OpenFor <= 0 {
		s.OpenFor = DefaultOpenFor
	}
	if s.FirstProbe <= 0 {
		s.FirstProbe = DefaultFirstProbe
	}
	s.FirstProbe = min(s.FirstProbe, s.OpenFor)
	if s.Clock == nil {
		s.Clock = time.Now
	}
	return s
}

// Breaker is one circuit breaker. It is safe for simultaneous use.
type Breaker struct {
	name string
	s    Settings

	// clean is set while the breaker is closed with no failure counted: a call let
	// through and its success then take no lock. It is written with mu held.
	clean atomic.Bool

	mu       sync.Mutex
	state    State
	gen      atomic.Uint64 // counts state changes; a permit of an older one is stale. Written with mu held.
	failures int           // consecutive, while closed
	wait     time.Duration // the current wait between probes, while not closed
	probeAt  time.Time     // when open: the earliest probe
	probing  bool          // when half-open: the probe is in flight
}

// New returns a closed breaker called name.
func New(name string, s Settings) *Breaker {
	b := &Breaker{name: name, s: s.withDefaults()}
	b.clean.Store(true)
	return b
}

// Name returns the breaker's name.
func (b *Breaker) Name() string { return b.name }

// State returns the breaker's state. An open breaker whose wait is over stays open
// until a call probes.
func (b *Breaker) State() State {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state
}

// Permit is a call let through. Its Done must be called once the call ends.
type Permit struct {
	b     *Breaker
	gen   uint64
	probe bool
}

// Allow lets a call through, or returns ErrOpen. A call let through while the breaker
// is open (its wait over) is the probe: the breaker is half-open until it is Done.
func (b *Breaker) Allow() (Permit, error) {
	if b.clean.Load() {
		return Permit{b: b, gen: b.gen.Load()}, nil
	}
	b.mu.Lock()
	from := b.state
	switch from {
	case Closed:
		p := Permit{b: b, gen: b.gen.Load()}
		b.mu.Unlock()
		return p, nil
	case Open:
		if b.s.Clock().Before(b.probeAt) {
			b.mu.Unlock()
			return Permit{}, ErrOpen
		}
		b.set(HalfOpen)
	default: // HalfOpen
		if b.probing {
			b.mu.Unlock()
			return Permit{}, ErrOpen
		}
	}
	b.probing = true
	p := Permit{b: b, gen: b.gen.Load(), probe: true}
	b.changed(from, HalfOpen) // unlocks
	return p, nil
}

// Done reports the call's result. A permit taken before the breaker last changed
// state reports nothing. Done on the zero Permit does nothing.
func (p Permit) Done(r Result) {
	b := p.b
	if b == nil || !p.probe && r != Failure && b.clean.Load() {
		return // nothing to count, or nothing to reset
	}
	b.mu.Lock()
	if p.gen != b.gen.Load() || !p.probe && (r == Ignore || b.state != Closed) {
		// Stale, or let through without a lock as the breaker opened: only a probe
		// speaks for a breaker that is not closed.
		b.mu.Unlock()
		return
	}
	from := b.state
	switch {
	case r == Ignore: // the probe's caller went away: the next call probes
		b.probing = false
		b.mu.Unlock()
		return
	case r == Success && from == Closed:
		b.failures = 0
		b.clean.Store(true)
		b.mu.Unlock()
		return
	case r == Success:
		b.failures, b.wait = 0, 0
		b.set(Closed)
	case from == Closed:
		b.clean.Store(false)
		if b.failures++; b.failures < b.s.Failures {
			b.mu.Unlock()
			return
		}
		b.open(b.s.FirstProbe)
	default: // a failed probe; the wait is 0 after ProbeNow
		b.open(min(max(2*b.wait, b.s.FirstProbe), b.s.OpenFor))
	}
	b.changed(from, b.state)
}

// ProbeNow tells the breaker that its node may have been replaced (a Sentinel named
// a new master), so the wait learnt on the old one no longer applies: an open breaker
// lets the next call probe at once, and a failed probe then waits FirstProbe again,
// as after opening. A closed breaker does not change.
func (b *Breaker) ProbeNow() {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case Open:
		b.probeAt = time.Time{}
		b.wait = 0
	case HalfOpen: // the probe in flight may be the old node's
		b.wait = 0
	}
}

// open opens the breaker for wait. b.mu must be held.
func (b *Breaker) open(wait time.Duration) {
	b.wait = wait
	b.probeAt = b.s.Clock().Add(wait)
	b.set(Open)
}

// set moves the breaker to state. b.mu must be held.
func (b *Breaker) set(s State) {
	b.state = s
	b.gen.Add(1)
	b.probing = false
	b.clean.Store(s == Closed && b.failures == 0)
}

// changed unlocks b.mu and calls OnChange.
func (b *Breaker) changed(from, to State) {
	b.mu.Unlock()
	if b.s.OnChange != nil && from != to {
		b.s.OnChange(b.name, from, to)
	}
}

// Status is one node's breaker state, and the error of its last health check.
type Status struct {
	Node  string
	State State
	Err   error
}

// Set holds a breaker per node, created on first use. It is safe for simultaneous
// use.
type Set struct {
	s  Settings
	mu sync.RWMutex
	m  map[string]*Breaker
}

// NewSet returns an empty set whose breakers take s.
func NewSet(s Settings) *Set {
	return &Set{s: s, m: map[string]*Breaker{}}
}

// Get returns node's breaker, creating it closed.
func (s *Set) Get(node string) *Breaker {
	s.mu.RLock()
	b := s.m[node]
	s.mu.RUnlock()
	if b != nil {
		return b
	}
	s.mu.Lock()
	if b = s.m[node]; b != nil {
		s.mu.Unlock()
		return b
	}
	b = New(node, s.s)
	s.m[node] = b
	s.mu.Unlock()
	if s.s.OnChange != nil {
		s.s.OnChange(node, Closed, Closed)
	}
	return b
}

// Retain drops the breakers of nodes not in keep (nodes gone from the topology).
func (s *Set) Retain(keep []string) {
	var dropped []string
	s.mu.Lock()
	for n := range s.m {
		if !slices.Contains(keep, n) {
			delete(s.m, n)
			dropped = append(dropped, n)
		}
	}
	s.mu.Unlock()
	if s.s.OnRemove != nil {
		for _, n := range dropped {
			s.s.OnRemove(n)
		}
	}
}

// States returns every breaker's state.
func (s *Set) States() []Status {
	s.mu.RLock()
	bs := make([]*Breaker, 0, len(s.m))
	for _, b := range s.m {
		bs = append(bs, b)
	}
	s.mu.RUnlock()
	out := make([]Status, len(bs))
	for i, b := range bs {
		out[i] = Status{Node: b.name, State: b.State()}
	}
	slices.SortFunc(out, func(a, b Status) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// Worst returns the worst state of sts (Open before HalfOpen before Closed), or Closed
// when sts is empty.
func Worst(sts []Status) State {
	w := Closed
	for _, st := range sts {
		w = max(w, st.State)
	}
	return w
}
