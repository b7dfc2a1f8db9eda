package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestClusterMultiRule decides one client's requests on a three-master cluster: three
// meters of the client's own rules share its hash tag (one slot, one script), and a
// global rule's meter lives in another slot on another master. The tightest limit
// (gcra, 3 per hour) admits three requests and denies the rest; the denied requests
// must charge none of the other limits, which a final peek (cost 0) checks. The Lua
// library is flushed on every master before the first denial, so the decide and the
// refund calls both go through FCALL, "Function not found", a reload, then FCALL.
func TestClusterMultiRule(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	cc := cl.Client(t)
	store := loadedStore(t, cc)
	ctx := context.Background()
	addrOf := func(key string) string {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m.Options().Addr
	}

	perKey := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 5, Period: time.Hour}}}
	perRoute := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 3, Period: time.Hour, Burst: 3}}}
	tiers := algo.Meter{Limits: []algo.Limit{
		{Algorithm: algo.BucketRing, Count: 4, Period: time.Hour, Bucket: 10 * time.Minute},
		{Algorithm: algo.BucketRing, Count: 10, Period: 24 * time.Hour, Bucket: 10 * time.Minute},
	}}
	global := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.TokenBucket, Count: 100, Period: 24 * time.Hour, Burst: 100}}}

	tests := []struct {
		name        string
		globalFirst bool // the global slot is charged first, then refunded on denial
	}{
		{"client slot first", false},
		{"global slot first", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tag := algo.Escape(fmt.Sprintf("client-%t", tt.globalFirst))
			type rule struct {
				key  string
				m    algo.Meter
				want []int64 // Remaining per limit after three admitted requests
			}
			rules := []rule{
				{algo.Key("tg:", tag, "per-key", "", "0"), perKey, []int64{5 - 3}},
				{algo.Key("tg:", tag, "per-route", "GET:"+algo.Escape("/v1/items"), "0"), perRoute, []int64{0}},
				{algo.Key("tg:", tag, "tiers", "", "0"), tiers, []int64{4 - 3, 10 - 3}},
			}
			for i := 0; ; i++ {
				k := algo.Key("tg:", fmt.Sprintf("global-%d", i), "global", tag, "0")
				if addrOf(k) != addrOf(rules[0].key) {
					g := rule{k, global, []int64{100 - 3}}
					if tt.globalFirst {
						rules = append([]rule{g}, rules...)
					} else {
						rules = append(rules, g)
					}
					break
				}
			}
			var keys []string
			var meters []algo.Meter
			for _, r := range rules {
				keys, meters = append(keys, r.key), append(meters, r.m)
			}

			for i := range 6 {
				if i == 3 {
					flushLibrary(t, cc)
				}
				c := algo.Check{Keys: keys, Meters: meters, Cost: 1}
				o, err := safeDecide(ctx, store, c)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				if got, want := o.Allowed, i < 3; got != want {
					t.Errorf("request %d: Check(%v).Allowed = %v, want %v", i, keys, got, want)
				}
			}

			o, err := safeDecide(ctx, store, algo.Check{Keys: keys, Meters: meters, Cost: 0})
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rules {
				for j, d := range o.Decisions[i] {
					if d.Remaining != r.want[j] {
						t.Errorf("peek: Check(%s).Remaining = %d, want %d", r.m.Limits[j], d.Remaining, r.want[j])
					}
				}
			}
		})
	}

	// The flushes sent the calls through "Function not found" and back.
	var notFound atomic.Int64
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		info, err := m.Info(ctx, "errorstats").Result()
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_ERR:count="); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				notFound.Add(n)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if notFound.Load() == 0 {
		t.Errorf("\"Function not found\" errors on the masters after FUNCTION FLUSH = 0, want at least 1")
	}
	if have, masters := libraryLoaded(t, cc); have != masters {
		t.Errorf("Lua library on %d of %d masters after the run, want every master (Preload loads it on all)", have, masters)
	}

	// Nothing the run wrote, refunds included, lives forever.
	err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		iter := m.Scan(ctx, 0, "*", 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			if ttl, err := m.Do(ctx, "PTTL", k).Int64(); err != nil || ttl == -1 {
				t.Errorf("PTTL %s = %d, %v, want a TTL", k, ttl, err)
			}
		}
		return iter.Err()
	})
	if err != nil {
		t.Fatal(err)
	}
}

// flushLibrary empties the function libraries and the script cache of every master
// and checks that tollgate's library is gone.
func flushLibrary(t *testing.T, cc *redis.ClusterClient) {
	t.Helper()
	ctx := context.Background()
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		if err := m.FunctionFlush(ctx).Err(); err != nil {
			return err
		}
		return m.ScriptFlush(ctx).Err()
	})
	if err != nil {
		t.Fatal(err)
	}
	if have, _ := libraryLoaded(t, cc); have > 0 {
		t.Fatalf("Lua library still loaded on %d masters after FUNCTION FLUSH", have)
	}
}

// libraryLoaded returns how many masters have tollgate's library, of how many.
func libraryLoaded(t *testing.T, cc *redis.ClusterClient) (have, masters int64) {
	t.Helper()
	var h, n atomic.Int64
	err := cc.ForEachMaster(context.Background(), func(ctx context.Context, m *redis.Client) error {
		libs, err := m.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: algo.Lua().Name}).Result()
		n.Add(1)
		if len(libs) > 0 {
			h.Add(1)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return h.Load(), n.Load()
}
