package redisstore

import (
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestSwitchWatchFollowsNextSentinel runs a switch watch over a dead address and two
// redis-servers standing in for Sentinels (any server relays PUBLISH): it skips the
// dead one, reports the switches of its master and no other, moves to the next
// server when its own dies, survives idle PINGs, and its goroutine ends with ctx.
func TestSwitchWatchFollowsNextSentinel(t *testing.T) {
	a, b := redistest.StartServer(t), redistest.StartServer(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()

	goroutines := runtime.NumGoroutine()
	switches := make(chan string, 10)
	w := &switchWatch{
		master:    "m",
		sentinels: []string{dead, a.Addr, b.Addr},
		options: func(addr string) *redis.Options {
			return &redis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1, DisableIdentity: true}
		},
		onSwitch: func(addr string) { switches <- addr },
		idle:     100 * time.Millisecond,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	defer func() {
		cancel()
		<-done
	}()

	subscribed := func(s *redistest.Server) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			n := s.Do(t, "PUBSUB", "NUMSUB", switchChannel).([]any)[1]
			if n == int64(1) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("PUBSUB NUMSUB %s on %s = %v after 5s, want 1", switchChannel, s.Addr, n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	want := func(addr string) {
		t.Helper()
		select {
		case got := <-switches:
			if got != addr {
				t.Errorf("switch = %s, want %s", got, addr)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no switch after 5s, want %s", addr)
		}
	}

	subscribed(a)
	a.Do(t, "PUBLISH", switchChannel, "other 127.0.0.1 1 127.0.0.1 2")
	a.Do(t, "PUBLISH", switchChannel, "m 127.0.0.1 1")
	a.Do(t, "PUBLISH", switchChannel, "m 127.0.0.1 1 127.0.0.1 2")
	want("127.0.0.1:2")
	a.Kill()
	subscribed(b)
	time.Sleep(3 * w.idle) // a PING or two on a silent subscription
	b.Do(t, "PUBLISH", switchChannel, "m 127.0.0.1 2 ::1 3")
	want("[::1]:3")
	select {
	case got := <-switches:
		t.Errorf("extra switch %s, want none", got)
	default:
	}

	cancel()
	select {
	case <-done:
	case <-time.After(time.Second):
		t.Fatal("watch still running 1s after its context ended")
	}
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > goroutines && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines = %d after the watch ended, want at most %d (leak?)\n%s", n, goroutines, buf[:runtime.Stack(buf, true)])
	}
}
