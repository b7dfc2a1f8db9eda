// Package memstore decides tollgate's meters in process with the Go models of
// shared/algo: the store of local limits, of the degraded mode when Redis is down, and
// of the Envoy filter's local fallback. It imports only the standard library and
// shared/algo, and compiles for GOOS=wasip1.
package memstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// DefaultMaxKeys bounds the number of keys a Store keeps when New is given 0.
const DefaultMaxKeys = 100000

// Store keeps meter states in a map. It is safe for simultaneous use. Expired states
// are dropped as they are met and when the store is full; when a sample of a full
// store holds only live states, the one of them that expires first is forgotten to
// make room (that client's limit restarts from empty: the store errs toward admitting
// rather than growing without bound).
type Store struct {
	mu     sync.Mutex
	states map[string]algo.State
	max    int
	clock  func() time.Time
	// reserved holds the records of reservations (PutReservation), at most max.
	reserved map[string]reservation
}

// New returns a store that keeps at most maxKeys keys (0: DefaultMaxKeys) and reads
// the time from clock when a check carries none (nil: time.Now).
func New(maxKeys int, clock func() time.Time) *Store {
	if maxKeys <= 0 {
		maxKeys = DefaultMaxKeys
	}
	if clock == nil {
		clock = time.Now
	}
	return &Store{states: make(map[string]algo.State), max: maxKeys, clock: clock}
}

// Len returns the number of keys held, expired ones included until they are swept.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.states)
}

// State returns the state stored for key, if any and not expired at now (Unix µs).
func (s *Store) State(key string, now int64) (algo.State, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.states[key]
	if !ok || st.ExpiresMicros <= now {
		return algo.State{}, false
	}
	return st, true
}

// Reset forgets the state of the given keys.
func (s *Store) Reset(keys ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, k := range keys {
		delete(s.states, k)
	}
}

// Decide decides every meter of c together, all-or-nothing, as the Redis scripts do.
func (s *Store) Decide(_ context.Context, c algo.Check) (algo.Outcome, error) {
	if len(c.Keys) != len(c.Meters) {
		return algo.Outcome{}, fmt.Errorf("memstore: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	if c.Cost < 0 {
		return algo.Outcome{}, errors.New("memstore: negative cost")
	}
	now := c.NowMicros
	if now == 0 {
		now = s.clock().UnixMicro()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.Settle {
		return s.settle(c, now)
	}
	out := algo.Outcome{Allowed: true, NowMicros: now, Decisions: make([][]algo.Decision, len(c.Meters))}
	next := make([]algo.State, len(c.Meters))
	charge := make([]bool, len(c.Meters))
	for i, m := range c.Meters {
		ns, ds := m.StepMicros(s.get(c.Keys[i], now), now, c.Cost)
		out.Decisions[i] = ds
		if algo.Allowed(ds) {
			next[i], charge[i] = ns, true
		} else if !m.Shadow {
			out.Allowed = false
		}
	}
	if !out.Allowed || c.Cost == 0 {
		return out, nil
	}
	for i := range c.Meters {
		if charge[i] {
			s.put(c.Keys[i], next[i], now)
		}
	}
	return out, nil
}

// settle charges every meter of c at now, never refusing (algo.Meter.Settle). Every
// meter is checked first, so a meter that cannot settle leaves every state as it was.
func (s *Store) settle(c algo.Check, now int64) (algo.Outcome, error) {
	for _, m := range c.Meters {
		if !m.Algorithm().CanSettle() {
			return algo.Outcome{}, fmt.Errorf("memstore: %w", algo.ErrCannotSettle)
		}
	}
	out := algo.Outcome{Allowed: true, NowMicros: now, Decisions: make([][]algo.Decision, len(c.Meters))}
	for i, m := range c.Meters {
		st := s.get(c.Keys[i], now)
		ns, ds, err := m.SettleMicros(st, now, c.Cost)
		if err != nil {
			return algo.Outcome{}, fmt.Errorf("memstore: %w", err)
		}
		out.Decisions[i] = ds
		if c.Cost > 0 {
			s.put(c.Keys[i], ns, now)
		}
	}
	return out, nil
}

// get returns the state of key at now: a state past its expiry is an absent key.
func (s *Store) get(key string, now int64) algo.State {
	st := s.states[key]
	if st.Set && st.ExpiresMicros <= now {
		// Every model treats a state past its expiry exactly like an absent key.
		return algo.State{}
	}
	return st
}

// put stores st for key, making room in a full store.
func (s *Store) put(key string, st algo.State, now int64) {
	if !st.Set {
		delete(s.states, key)
		return
	}
	if _, ok := s.states[key]; !ok && len(s.states) >= s.max {
		s.evict(now)
	}
	s.states[key] = st
}

// evictSample is how many states evict examines: a bounded amount of work per insert
// into a full store, however large the store.
const evictSample = 64

// evict makes room in a full store: among a sample of states (map iteration starts at
// a random place) it drops the expired ones, and if none was, the one that expires
// first.
func (s *Store) evict(now int64) {
	var oldest string
	oldestAt := int64(-1)
	dropped, seen := false, 0
	for k, st := range s.states {
		if seen++; seen > evictSample {
			break
		}
		if st.ExpiresMicros <= now {
			delete(s.states, k)
			dropped = true
			continue
		}
		if oldestAt < 0 || st.ExpiresMicros < oldestAt {
			oldest, oldestAt = k, st.ExpiresMicros
		}
	}
	if !dropped && oldestAt >= 0 {
		delete(s.states, oldest)
	}
}
