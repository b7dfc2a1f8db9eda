package engine_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/breaker"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// breakerCount is a node store that counts the calls that replace its breakers.
type breakerCount struct {
	*redisstore.Store
	calls int
}

func (s *breakerCount) UseBreakers(st breaker.Settings) {
	s.calls++
	s.Store.UseBreakers(st)
}

// TestKeepStoreBreakers checks that an engine made with KeepStoreBreakers leaves a
// node store's breakers to the engine that sets them, at New and at SetPolicy, and
// that one made without it sets them at both.
func TestKeepStoreBreakers(t *testing.T) {
	t.Parallel()
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + redistest.StartServer(t).Addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	other := nodePolicy(t, "open")
	other.Failure.Breaker.Failures++ // settings that differ, so that SetPolicy would replace them
	for _, tc := range []struct {
		keep bool
		want int // calls after New, then after SetPolicy
	}{{false, 2}, {true, 0}} {
		s := &breakerCount{Store: st}
		eng, err := engine.New(engine.Config{Policy: nodePolicy(t, "open"), Store: s, KeepStoreBreakers: tc.keep})
		if err != nil {
			t.Fatal(err)
		}
		if err := eng.SetPolicy(other); err != nil {
			t.Fatal(err)
		}
		if s.calls != tc.want {
			t.Errorf("KeepStoreBreakers %v: UseBreakers called %d times by New and SetPolicy, want %d", tc.keep, s.calls, tc.want)
		}
	}
}
