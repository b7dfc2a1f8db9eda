package redisstore_test

import (
	"context"
	"errors"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// meterOf returns a one-limit meter of algorithm a admitting count units per period:
// a burst of count where the algorithm takes one, and a ring of ten buckets for
// bucket_ring, so that no window edge empties it at once.
func meterOf(a algo.Algorithm, count int64, period time.Duration) algo.Meter {
	l := algo.Limit{Algorithm: a, Count: count, Period: period}
	if a.HasBurst() {
		l.Burst = count
	}
	if a == algo.BucketRing {
		l.Bucket = period / 10
	}
	return algo.Meter{Limits: []algo.Limit{l}}
}

// loadedStore returns a store on client with its Lua library loaded, so that the
// first decisions already run FCALL.
func loadedStore(t *testing.T, client redis.UniversalClient) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(client)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	return s
}

// loadLua loads tollgate's Lua library on c and returns it, for tests that call its
// entry points directly (FCALL).
func loadLua(t testing.TB, c redis.Cmdable) algo.Library {
	t.Helper()
	lua := algo.Lua()
	if err := c.FunctionLoadReplace(context.Background(), lua.FunctionSource()).Err(); err != nil {
		t.Fatal(err)
	}
	return lua
}

// serverTime returns the clock of the Redis server behind c, in Unix microseconds.
func serverTime(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// awayFromEdge waits, when the server's clock is less than margin before an edge of
// the windows of length period, until the edge has passed, so that a short burst of
// requests falls in one fixed window.
func awayFromEdge(t *testing.T, c redis.Cmdable, period, margin time.Duration) {
	t.Helper()
	p := period.Microseconds()
	now := serverTime(t, c)
	if left := p - now%p; left < margin.Microseconds() {
		time.Sleep(time.Duration(left+1000) * time.Microsecond)
	}
}

// scanKeys returns the keys of c matching pattern, sorted.
func scanKeys(t *testing.T, c redis.Cmdable, pattern string) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	sort.Strings(keys)
	return keys
}

// globEscape escapes the glob characters of s for SCAN MATCH.
func globEscape(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}

// A keyState is the stored form of one key: its DUMP and its absolute expiry.
type keyState struct {
	Dump       string
	ExpireTime int64 // PEXPIRETIME: Unix ms, -1 without a TTL
}

// snapshot returns the DUMP and PEXPIRETIME of every key of c that starts with
// prefix: a meter key and the keys derived from it (fixed_window's K:<w>, K:<w>:r).
func snapshot(t *testing.T, c *redis.Client, prefix string) map[string]keyState {
	t.Helper()
	ctx := context.Background()
	snap := map[string]keyState{}
	for _, k := range scanKeys(t, c, globEscape(prefix)+"*") {
		d, err := c.Dump(ctx, k).Result()
		if errors.Is(err, redis.Nil) {
			continue // expired between SCAN and DUMP
		}
		if err != nil {
			t.Fatal(err)
		}
		exp, err := c.Do(ctx, "PEXPIRETIME", k).Int64()
		if err != nil {
			t.Fatal(err)
		}
		snap[k] = keyState{Dump: d, ExpireTime: exp}
	}
	return snap
}

// diffSnapshots describes how after differs from before, or returns "".
func diffSnapshots(before, after map[string]keyState) string {
	var b strings.Builder
	for k, v := range before {
		w, ok := after[k]
		switch {
		case !ok:
			b.WriteString("\n  " + k + ": deleted")
		case w.Dump != v.Dump:
			b.WriteString("\n  " + k + ": DUMP changed")
		case w.ExpireTime != v.ExpireTime:
			b.WriteString("\n  " + k + ": PEXPIRETIME changed")
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			b.WriteString("\n  " + k + ": created")
		}
	}
	return b.String()
}

// raceClients runs fn(0) … fn(n-1) on n goroutines released together by a barrier
// once all have started, and returns how many returned true. Errors fail t.
func raceClients(t *testing.T, n int, fn func(i int) (bool, error)) int {
	t.Helper()
	var ready, done sync.WaitGroup
	start := make(chan struct{})
	results := make([]bool, n)
	errs := make([]error, n)
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-start
			results[i], errs[i] = fn(i)
		}()
	}
	ready.Wait()
	close(start)
	done.Wait()
	admitted := 0
	for i := range n {
		if errs[i] != nil {
			t.Errorf("client %d: %v", i, errs[i])
		}
		if results[i] {
			admitted++
		}
	}
	return admitted
}

// maxInSpan returns the most of the sorted times at that fall in one half-open span
// [t, t+span).
func maxInSpan(at []int64, span int64) int {
	best, j := 0, 0
	for i := range at {
		for j < len(at) && at[j] < at[i]+span {
			j++
		}
		best = max(best, j-i)
	}
	return best
}
