package redisstore_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestSentinelSwitchProbesAtOnce kills a Sentinel group's master while the store's
// breaker is open with an hour's wait: only the store's +switch-master watch can
// let a call through, and once every Sentinel names the new master the next call
// must be decided there. Closing the store ends its goroutines.
func TestSentinelSwitchProbesAtOnce(t *testing.T) {
	sg := redistest.StartSentinel(t)
	goroutines := runtime.NumGoroutine()
	s, err := redisstore.Open(redisstore.Config{URL: sg.URL()})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	s.UseBreakers(breaker.Settings{Failures: 1, FirstProbe: time.Hour, OpenFor: time.Hour})
	check := algo.Check{Keys: []string{"test:switch"}, Meters: []algo.Meter{meterOf(algo.FixedWindow, 1000, time.Hour)}, Cost: 1}
	if _, err := s.Decide(ctx, check); err != nil {
		t.Fatalf("Decide() before the kill = %v, want nil", err)
	}

	sg.Master().Kill()
	killed := time.Now()
	if _, err := s.Decide(ctx, check); err == nil {
		t.Fatal("Decide() on the dead master = nil, want an error")
	}
	if got := breaker.Worst(s.Breakers()); got != breaker.Open {
		t.Fatalf("breaker after a failure = %v, want open", got)
	}
	p := sg.WaitPromoted(t, sg.Replica(), 20*time.Second)
	// From when every Sentinel names the new master, the failover client dials it.
	var decided time.Time
	for deadline := p.Agreed.Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if _, err := s.Decide(ctx, check); err == nil {
			decided = time.Now()
			break
		}
	}
	if decided.IsZero() {
		t.Fatalf("Decide() still failing 2s after every Sentinel named the new master (breakers %v), want decided", s.Breakers())
	}
	t.Logf("named by the first Sentinel %v after the kill, by all %v; decided %v after the first",
		p.Announced.Sub(killed).Round(time.Millisecond), p.Agreed.Sub(killed).Round(time.Millisecond), decided.Sub(p.Announced).Round(time.Millisecond))

	if err := s.Close(); err != nil {
		t.Errorf("Close() = %v, want nil", err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines = %d after Close, want at most %d (leak?)\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}
