package engine

import (
	"context"
	"sync"
	"time"
)

// budget is the context a store decision runs in. It ends at the policy's timeout, or
// at the caller's deadline if that comes first, without what context.WithTimeout costs
// on every decision (a timer, a cancellation context and its channel: five
// allocations): decisions whose deadlines fall in the same millisecond share one
// channel, closed by one timer, and budgets are pooled.
//
// A budget carries the caller's values but not its cancellation: a store call is
// bounded by the timeout anyway, and a charge that completes for a caller that has
// gone away does no harm.
type budget struct {
	parent   context.Context
	deadline time.Time
	done     chan struct{}
}

var budgets = sync.Pool{New: func() any { return new(budget) }}

// newBudget returns a budget of parent that ends at deadline, or at parent's own
// deadline if that comes first. Release it with releaseBudget once the call returns.
func newBudget(parent context.Context, deadline time.Time) *budget {
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	b := budgets.Get().(*budget)
	b.parent, b.deadline, b.done = parent, deadline, slots.channel(deadline)
	return b
}

func releaseBudget(b *budget) {
	*b = budget{}
	budgets.Put(b)
}

// Deadline returns the decision's deadline.
func (b *budget) Deadline() (time.Time, bool) { return b.deadline, true }

// Done closes at the deadline, within a millisecond after it.
func (b *budget) Done() <-chan struct{} { return b.done }

// Err returns context.DeadlineExceeded once Done is closed.
func (b *budget) Err() error {
	select {
	case <-b.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// Value returns the caller's value for key.
func (b *budget) Value(key any) any { return b.parent.Value(key) }

// deadlineSlots hands out one channel per millisecond of deadlines, closed when that
// millisecond has passed.
type deadlineSlots struct {
	mu sync.Mutex
	ch map[int64]chan struct{} // by Unix millisecond
}

var slots = deadlineSlots{ch: map[int64]chan struct{}{}}

// channel returns the channel of the first millisecond boundary at or after at.
func (s *deadlineSlots) channel(at time.Time) chan struct{} {
	ms := (at.UnixNano() + int64(time.Millisecond) - 1) / int64(time.Millisecond)
	s.mu.Lock()
	ch, ok := s.ch[ms]
	if !ok {
		ch = make(chan struct{})
		s.ch[ms] = ch
		time.AfterFunc(time.Until(time.UnixMilli(ms)), func() {
			s.mu.Lock()
			delete(s.ch, ms)
			s.mu.Unlock()
			close(ch)
		})
	}
	s.mu.Unlock()
	return ch
}
