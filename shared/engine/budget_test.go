package engine_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// stuckStore is a store that never answers by itself: it returns when its context is
// done, as redisstore does when Redis hangs, and records what the context said.
type stuckStore struct {
	deadline time.Time
	err      error
	value    any
}

type ctxKey struct{}

func (s *stuckStore) Decide(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	s.deadline, _ = ctx.Deadline()
	s.value = ctx.Value(ctxKey{})
	<-ctx.Done()
	s.err = ctx.Err()
	return algo.Outcome{}, s.err
}

// TestStoreCallEndsAtTheTimeout checks that the context a store decides in closes at
// the policy's timeout (or the caller's earlier deadline), so that a store that hangs
// on anything (a dial, a full pool, a silent Redis) hands the request to the failure
// mode in time, and that it carries the caller's values.
func TestStoreCallEndsAtTheTimeout(t *testing.T) {
	p, err := policy.Parse([]byte("domain: d\nfailure: {mode: closed, timeout: 30ms}\nrules:\n  - name: r\n    match: {api_key: \"*\"}\n    limits:\n      - {algorithm: gcra, rate: 10/s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		caller time.Duration // the caller's own deadline; 0: none
		want   time.Duration
	}{
		{"policy timeout", 0, 30 * time.Millisecond},
		{"caller's earlier deadline", 10 * time.Millisecond, 10 * time.Millisecond},
		{"caller's later deadline", time.Second, 30 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := &stuckStore{}
			eng, err := engine.New(engine.Config{Policy: p, Store: st})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.WithValue(context.Background(), ctxKey{}, "trace-1")
			if tc.caller > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.caller)
				defer cancel()
			}
			start := time.Now()
			v, err := eng.Check(ctx, engine.Request{Domain: "d", Attributes: map[string]string{"api_key": "k"}, Cost: 1})
			took := time.Since(start)
			if err != nil || v.Allowed || !v.Degraded || v.Reason != engine.ReasonUnavailable {
				t.Fatalf("Check() = %+v, %v, want the closed failure mode", v, err)
			}
			if st.err != context.DeadlineExceeded {
				t.Errorf("store's ctx.Err() = %v, want context.DeadlineExceeded", st.err)
			}
			if d := st.deadline.Sub(start); d > tc.want+5*time.Millisecond || d < tc.want-5*time.Millisecond {
				t.Errorf("store's deadline is %v after the call, want about %v", d, tc.want)
			}
			if took < tc.want || took > tc.want+500*time.Millisecond {
				t.Errorf("Check took %v, want %v (and less than 500ms more)", took, tc.want)
			}
			if st.value != "trace-1" {
				t.Errorf("store's ctx.Value = %v, want the caller's", st.value)
			}
		})
	}
}
