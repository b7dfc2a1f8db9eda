package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestMeterSpec covers the meter spec of the library's entries (lua/library.lua's
// spec): a spec the library cannot read gets an error reply that names the problem,
// and a stream of distinct limits, more than the parsed specs it keeps, is decided
// limit by limit while the Lua memory of the functions stays bounded.
func TestMeterSpec(t *testing.T) {
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	lua := loadLua(t, client)
	decide := lua.Function(algo.EntryDecide)
	ctx := context.Background()

	for _, tt := range []struct{ spec, want string }{
		{"nope 0 1 1000000 1 0", `unknown algorithm "nope"`},
		{"gcra 2 1 1000000 1 0", "malformed meter spec"},
		{"", "malformed meter spec"},
		{"gcra 0", "malformed meter spec"},
		{"gcra 10 1 1000000 1 0", "malformed meter spec"},
		{"gcra 01 2 3 4 5", "malformed meter spec"},
		{"gcra 0 1 1000000 1", "malformed limits"},
		{"gcra 0 1 1000000 1 x", "malformed limits"},
		{"gcra 0 1 1000000 1 0 ", "malformed limits"},
		{"gcra 0 1 1000000 1.5 0", "malformed limits"},
		{"gcra 0 -1 1000000 1 0", "malformed limits"},
		{"gcra 0 inf 1000000 1 0", "malformed limits"},
	} {
		err := client.FCall(ctx, decide, []string{"spec:{bad}"}, "", 1, "0", 1, tt.spec, "").Err()
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("FCALL decide with spec %q: error %v, want one containing %q", tt.spec, err, tt.want)
		}
		// in a batch, the request fails alone: its neighbour is decided
		good := algo.DecideArgs([]algo.Meter{{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 5, Period: time.Second}}}}, 1, 0, false)
		args := append([]any{int64(2), "", 1, "0", 1, tt.spec, ""}, good...)
		v, err := client.FCall(ctx, lua.Function(algo.EntryMany), []string{"spec:{bad}", "spec:{good}"}, args...).Slice()
		if err != nil || len(v) != 2 {
			t.Fatalf("FCALL many with spec %q then a good one: %v, %v; want two replies", tt.spec, v, err)
		}
		if e, ok := v[0].(error); !ok || !strings.Contains(e.Error(), tt.want) {
			t.Errorf("FCALL many with spec %q: first reply %v, want an error containing %q", tt.spec, v[0], tt.want)
		}
		if _, ok := v[1].([]any); !ok {
			t.Errorf("FCALL many: the good request's reply is %v, want its decision", v[1])
		}
	}

	// 20,000 distinct limits, five times what the library keeps parsed
	const n = 20000
	before := memoryInfo(t, client, "used_memory_vm_functions")
	pipe := client.Pipeline()
	cmds := make([]*redis.Cmd, n)
	meters := make([][]algo.Meter, n)
	for i := range n {
		meters[i] = []algo.Meter{{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: int64(i + 2), Period: time.Hour}}}}
		cmds[i] = pipe.FCall(ctx, decide, []string{fmt.Sprintf("spec:%d", i)}, algo.DecideArgs(meters[i], 1, 0, false)...)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range cmds {
		rep, err := algo.ParseDecideReply(c.Val(), meters[i])
		if err != nil {
			t.Fatalf("decide of limit %d: %v", i+2, err)
		}
		if d := rep.Decisions[0][0]; !rep.Allowed || d.Remaining != int64(i+1) {
			t.Fatalf("first unit of a limit of %d: allowed %v, remaining %d; want allowed, %d", i+2, rep.Allowed, d.Remaining, i+1)
		}
	}
	// Measured on redis-server 7.0: 1.5 MB with the bound, 9.2 MB without it.
	if grown := memoryInfo(t, client, "used_memory_vm_functions") - before; grown > 4<<20 {
		t.Errorf("the functions' Lua memory grew by %d bytes over %d distinct limits, want at most 4 MiB", grown, n)
	}
}
