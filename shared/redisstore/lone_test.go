package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestFixedWindowCounted covers the path a one-meter fixed_window request takes
// (count.go: INCRBY, with the key's expiry on a window the store has not counted in;
// DECRBY when over; no script), on the process's clock (NowMicros 0) and on a
// caller's: a request whose cost is above the limit (which takes the library) leaves
// no key; a denial leaves the count and TTL as they were; a window's first charge
// sets its key's TTL (the reset plus a second's slack), which later charges leave
// alone; a key deleted under a remembered window gets its expiry back.
func TestFixedWindowCounted(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	store := loadedStore(t, client)
	ctx := context.Background()
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 3, Period: time.Minute}}}
	period := m.Limits[0].Period.Microseconds()

	for _, clock := range []string{"process", "caller"} {
		t.Run(clock, func(t *testing.T) {
			key := algo.Key("lone:", clock, "r", "", "0")
			var now int64 // 0: the store's process clock
			if clock == "caller" {
				// the start of a window, so that the whole test stays in it
				now = (time.Now().UnixMicro()/period + 1) * period
			}
			decide := func(cost int64) algo.Outcome {
				t.Helper()
				o, err := store.Decide(ctx, algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: cost, NowMicros: now})
				if err != nil {
					t.Fatal(err)
				}
				return o
			}
			// A charge over the limit on a window nobody charged leaves no key.
			if o := decide(4); o.Allowed {
				t.Fatal("cost 4 on a limit of 3: allowed")
			}
			if keys := scanKeys(t, client, "*lone*"+clock+"*"); len(keys) != 0 {
				t.Fatalf("after a denial on a new window, keys %v; want none", keys)
			}

			o := decide(1)
			if !o.Allowed {
				t.Fatal("first unit: denied")
			}
			w := o.NowMicros / period
			win := fmt.Sprintf("%s:%d", key, w)
			reset := o.Decisions[0][0].ResetAfter
			pttl := func() time.Duration {
				t.Helper()
				d, err := client.PTTL(ctx, win).Result()
				if err != nil || d <= 0 {
					t.Fatalf("PTTL %s = %v, %v; want a TTL", win, d, err)
				}
				return d
			}
			first := pttl()
			// the window's end plus the slack of a second for other instances' clocks
			if want := reset + time.Second; first > want+time.Millisecond || first < want-50*time.Millisecond {
				t.Errorf("PTTL after the first charge = %v, want the reset plus 1s, %v", first, want)
			}

			// A denial on a window with a count leaves the count and the TTL.
			if o := decide(3); o.Allowed {
				t.Fatal("cost 3 after 1 of 3: allowed")
			}
			if n, err := client.Get(ctx, win).Int64(); err != nil || n != 1 {
				t.Errorf("count after a denial = %d, %v; want 1", n, err)
			}
			if d := pttl(); d > first {
				t.Errorf("PTTL after a denial = %v, up from %v; a denial must not move it", d, first)
			}
			// The next charges count, and leave the TTL the first one set.
			if o := decide(2); !o.Allowed || o.Decisions[0][0].Remaining != 0 {
				t.Errorf("cost 2 after 1 of 3 = %+v; want allowed with 0 remaining", o)
			}
			if d := pttl(); d > first {
				t.Errorf("PTTL after a later charge = %v, up from %v", d, first)
			}
			if n, err := client.Get(ctx, win).Int64(); err != nil || n != 3 {
				t.Errorf("count = %d, %v; want 3", n, err)
			}
			// A window the store remembers, whose key is gone (a restart, a flush):
			// the next charge makes it anew and gives it its expiry again.
			if err := client.Del(ctx, win).Err(); err != nil {
				t.Fatal(err)
			}
			if o := decide(1); !o.Allowed || o.Decisions[0][0].Remaining != 2 {
				t.Errorf("cost 1 on a window whose key was deleted = %+v; want allowed with 2 remaining", o)
			}
			// (on a caller's clock the TTL is relative again, so its rounding may add a ms)
			if d := pttl(); d > first+time.Millisecond || d <= 0 {
				t.Errorf("PTTL after the key came back = %v, up from %v", d, first)
			}
		})
	}
	// Per clock: the cost-4 request takes the library (a cost above the limit never
	// counts); the others count, and the one denial of cost 3 gives its units back.
	if n := srv.ScriptCalls(t); n != 2 {
		t.Errorf("library calls = %d, want 2 (the two requests of a cost above the limit)", n)
	}
	if n := srv.CommandCalls(t, "incrby"); n != 8 {
		t.Errorf("INCRBY calls = %d, want 8 (four counted requests per clock)", n)
	}
	// The window's first charge sends the key's expiry; the charges after it, in a
	// window the store remembers, do not, except a denial's second round trip (the
	// key may have gone before its DECRBY) and the key's return.
	// (PEXPIREAT on the process's clock, PEXPIRE NX on a caller's.)
	if n := srv.CommandCalls(t, "pexpireat", "pexpire"); n != 6 {
		t.Errorf("PEXPIREAT and PEXPIRE calls = %d, want 6 (the first charge, the denial and the key's return, per clock)", n)
	}
	if n := srv.CommandCalls(t, "decrby"); n != 2 {
		t.Errorf("DECRBY calls = %d, want 2 (one counted denial per clock)", n)
	}
}

// vanishHook deletes key (through del) just before a pipeline that holds a DECRBY.
type vanishHook struct {
	key string
	del func()
}

func (vanishHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (vanishHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return next
}
func (h vanishHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if c.Name() == "decrby" {
				h.del()
			}
		}
		return next(ctx, cmds)
	}
}

// TestCountedDenialKeyGone deletes a window's key between a denied request's INCRBY
// and its DECRBY (as an eviction or a flush would): the DECRBY makes the key anew, at
// minus the cost, and the same round trip gives it its expiry, so it is gone when the
// window ends.
func TestCountedDenialKeyGone(t *testing.T) {
	srv := redistest.StartServer(t)
	admin := srv.Client(t)
	ctx := context.Background()
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 1, Period: time.Minute}}}
	key := algo.Key("gone:", "a", "r", "", "0")
	win, _ := m.Limits[0].WindowKey(key, time.Now().UnixMicro())
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { _ = client.Close() })
	client.AddHook(vanishHook{key: win, del: func() { admin.Del(ctx, win) }})
	store := loadedStore(t, client)
	check := algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1}
	if o, err := store.Decide(ctx, check); err != nil || !o.Allowed {
		t.Fatalf("first request: %v, %v; want allowed", o.Allowed, err)
	}
	if o, err := store.Decide(ctx, check); err != nil || o.Allowed {
		t.Fatalf("second request: %v, %v; want denied", o.Allowed, err)
	}
	n, err := admin.Get(ctx, win).Int64()
	if err != nil || n != -1 {
		t.Fatalf("count after the key went before the DECRBY = %d, %v; want -1", n, err)
	}
	if d, err := admin.PTTL(ctx, win).Result(); err != nil || d <= 0 || d > time.Minute+time.Second {
		t.Errorf("PTTL = %v, %v; want the window's end plus a second at most", d, err)
	}
}
