package redisstore_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// benchLimit admits far more than a benchmark can send: every decision is a charge.
func benchLimit(a algo.Algorithm) algo.Limit {
	l := algo.Limit{Algorithm: a, Count: 1000000, Period: time.Second}
	if a == algo.SlidingLog {
		l.Count = algo.MaxLogCount
	}
	return l
}

// benchClients is the number of distinct keys the benchmarks cycle through.
const benchClients = 10000

func benchKeys(prefix string) []string {
	keys := make([]string, benchClients)
	for i := range keys {
		keys[i] = algo.Key("bench:", fmt.Sprintf("client-%06d", i), prefix, "", "0")
	}
	return keys
}

// BenchmarkDecide measures one decision per algorithm, serially: the latency of a
// lone request through a store that sends every request on its own, through one
// whose batching MaxBatch 1 turns off, and through one that batches (a lone request
// must not wait for BatchWait).
func BenchmarkDecide(b *testing.B) {
	srv := redistest.StartServer(b)
	s := openStore(b, srv.URL(), false)
	ctx := context.Background()
	for _, a := range algo.Algorithms {
		m := []algo.Meter{{Limits: []algo.Limit{benchLimit(a)}}}
		keys := benchKeys(string(a))
		for _, mode := range []struct {
			name string
			d    decider
		}{
			{"store", s},
			{"unbatched", batched(b, s, redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: 1})},
			{"batcher", batched(b, s, batchOn)},
		} {
			b.Run(string(a)+"/"+mode.name, func(b *testing.B) {
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					i++
					if _, err := mode.d.Decide(ctx, algo.Check{Keys: keys[i%len(keys) : i%len(keys)+1], Meters: m, Cost: 1}); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkDecideParallel measures throughput with 64 requests in flight (on 2 CPUs,
// SetParallelism(32)), batched or not.
func BenchmarkDecideParallel(b *testing.B) {
	srv := redistest.StartServer(b)
	s := openStore(b, srv.URL(), false)
	ctx := context.Background()
	for _, a := range []algo.Algorithm{algo.GCRA, algo.FixedWindow, algo.TokenBucket} {
		m := []algo.Meter{{Limits: []algo.Limit{benchLimit(a)}}}
		keys := benchKeys(string(a))
		for _, mode := range []struct {
			name string
			d    decider
		}{
			{"store", s},
			{"unbatched", batched(b, s, redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: 1})},
			{"batcher", batched(b, s, batchOn)},
		} {
			b.Run(string(a)+"/"+mode.name, func(b *testing.B) {
				var next atomic.Int64
				b.ReportAllocs()
				b.SetParallelism(32)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						i := int(next.Add(1)) % len(keys)
						tctx, cancel := context.WithTimeout(ctx, time.Second)
						_, err := mode.d.Decide(tctx, algo.Check{Keys: keys[i : i+1], Meters: m, Cost: 1})
						cancel()
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}

// BenchmarkScriptCost measures what one call costs Redis itself (INFO commandstats
// usec per call, reported as redis-µs/call): the ceiling, redis_rate's GCRA, and an
// FCALL of tollgate's decide entry per algorithm. Commands are sent in pipelines of
// 100 to keep the client out of the measurement. make bench's report points here for
// Redis's own cost per call.
func BenchmarkScriptCost(b *testing.B) {
	srv := redistest.StartServer(b)
	s := openStore(b, srv.URL(), false)
	c := s.Client()
	ctx := context.Background()
	lua := loadLua(b, c)
	type script struct {
		name  string
		call  func(pipe redis.Pipeliner, keys []string)
		nkeys int // keys per call
	}
	evalsha := func(src string, args ...any) func(redis.Pipeliner, []string) {
		sc := redis.NewScript(src)
		if err := sc.Load(ctx, c).Err(); err != nil {
			b.Fatal(err)
		}
		return func(pipe redis.Pipeliner, keys []string) { sc.EvalSha(ctx, pipe, keys, args...) }
	}
	fcall := func(m []algo.Meter) func(redis.Pipeliner, []string) {
		args := algo.DecideArgs(m, 1, 0, false)
		return func(pipe redis.Pipeliner, keys []string) {
			pipe.FCall(ctx, lua.Function(algo.EntryDecide), keys, args...)
		}
	}
	cases := []script{
		{"return1", evalsha("return 1"), 1},
		{"redis_rate", evalsha(redisRateScript, 1000000, 1000000, 1.0, 1), 1},
	}
	for _, a := range algo.Algorithms {
		cases = append(cases, script{"tollgate-" + string(a), fcall([]algo.Meter{{Limits: []algo.Limit{benchLimit(a)}}}), 1})
	}
	gcra := algo.Meter{Limits: []algo.Limit{benchLimit(algo.GCRA)}}
	cases = append(cases, script{"tollgate-3-limits-gcra", fcall([]algo.Meter{gcra, gcra, gcra}), 3})
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			keys := benchKeys(tc.name)
			before := readInfo(b, c)
			i := 0
			for b.Loop() {
				pipe := c.Pipeline()
				for range 100 {
					i++
					k := keys[i%len(keys)]
					ks := []string{k}
					for j := 1; j < tc.nkeys; j++ {
						ks = append(ks, fmt.Sprintf("%s:%d", k, j))
					}
					tc.call(pipe, ks)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
			after := readInfo(b, c)
			script := func(name string) bool { return name == "evalsha" || name == "fcall" }
			d0, d1 := before.Sum(script), after.Sum(script)
			b.ReportMetric((d1.Usec-d0.Usec)/(d1.Calls-d0.Calls), "redis-µs/call")
			// CPU time is steadier than commandstats' wall time on a busy machine: a
			// call that the scheduler preempts does not count the wait.
			b.ReportMetric((after.CPU-before.CPU)*1e6/float64(b.N*100), "redis-cpu-µs/call")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100)/1e3, "µs/call")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// readInfo reads Redis's INFO commandstats and cpu, failing b on an error.
func readInfo(b *testing.B, c redis.UniversalClient) redisinfo.Stats {
	b.Helper()
	st, err := redisinfo.Read(context.Background(), c)
	if err != nil {
		b.Fatal(err)
	}
	return st
}

// redisRateScript is go-redis/redis_rate v10's allowN script (lua.go), for the cost
// comparison.
const redisRateScript = `
-- this script has side-effects, so it requires replicate commands mode
redis.replicate_commands()

local rate_limit_key = KEYS[1]
local burst = ARGV[1]
local rate = ARGV[2]
local period = ARGV[3]
local cost = tonumber(ARGV[4])

local emission_interval = period / rate
local increment = emission_interval * cost
local burst_offset = emission_interval * burst

-- redis returns time as an array containing two integers: seconds of the epoch
-- time (10 digits) and microseconds (6 digits). for convenience we need to
-- convert them to a floating point number. the resulting number is 16 digits,
-- bordering on the limits of a 64-bit double-precision floating point number.
-- adjust the epoch to be relative to Jan 1, 2017 00:00:00 GMT to avoid floating
-- point problems. this approach is good until "now" is 2,483,228,799 (Wed, 09
-- Sep 2048 01:46:39 GMT), when the adjusted value is 16 digits.
local jan_1_2017 = 1483228800
local now = redis.call("TIME")
now = (now[1] - jan_1_2017) + (now[2] / 1000000)

local tat = redis.call("GET", rate_limit_key)

if not tat then
  tat = now
else
  tat = tonumber(tat)
end

tat = math.max(tat, now)

local new_tat = tat + increment
local allow_at = new_tat - burst_offset

local diff = now - allow_at
local remaining = diff / emission_interval

if remaining < 0 then
  local reset_after = tat - now
  local retry_after = diff * -1
  return {
    0, -- allowed
    0, -- remaining
    tostring(retry_after),
    tostring(reset_after),
  }
end

local reset_after = new_tat - now
if reset_after > 0 then
  redis.call("SET", rate_limit_key, new_tat, "EX", math.ceil(reset_after))
end
local retry_after = -1
return {cost, remaining, tostring(retry_after), tostring(reset_after)}
`

// BenchmarkManyScriptCost measures what Redis spends per request inside one call of
// the many entry (a batch of 64 one-limit requests), against the decide entry called
// once per request (BenchmarkScriptCost): redis-cpu-µs/req.
func BenchmarkManyScriptCost(b *testing.B) {
	srv := redistest.StartServer(b)
	s := openStore(b, srv.URL(), false)
	c := s.Client()
	ctx := context.Background()
	many := loadLua(b, c).Function(algo.EntryMany)
	const batch = 64
	for _, a := range []algo.Algorithm{algo.GCRA, algo.FixedWindow, algo.TokenBucket} {
		b.Run(string(a), func(b *testing.B) {
			m := []algo.Meter{{Limits: []algo.Limit{benchLimit(a)}}}
			keys := benchKeys("many-" + string(a))
			checks := make([]algo.Check, batch)
			before := readInfo(b, c)
			i := 0
			for b.Loop() {
				for j := range checks {
					i++
					checks[j] = algo.Check{Keys: keys[i%len(keys) : i%len(keys)+1], Meters: m, Cost: 1}
				}
				ks, args := algo.ManyCall(checks)
				if err := c.FCall(ctx, many, ks, args...).Err(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((readInfo(b, c).CPU-before.CPU)*1e6/float64(b.N*batch), "redis-cpu-µs/req")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// BenchmarkCounted measures what Redis runs for a one-limit fixed_window decision,
// which the store counts with no script (count.go), through a store that sends every
// request on its own: in windows the store has counted in already (INCRBY alone: the
// window set) and in windows new to it (INCRBY + PEXPIREAT). It reports Redis's
// commands and CPU per decision; without the window set, "counted" would send two
// commands per decision where it sends one.
func BenchmarkCounted(b *testing.B) {
	srv := redistest.StartServer(b)
	s := openStore(b, srv.URL(), false)
	ctx := context.Background()
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 1 << 40, Period: time.Hour}}}
	for _, tc := range []struct {
		name string
		keys func(i int) string
	}{
		{"counted", func(i int) string { return fmt.Sprintf("bench:{c%d}counted", i%100) }},
		{"new", func(i int) string { return fmt.Sprintf("bench:{c%d}new", i) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for i := range 100 { // the windows of "counted" become known
				if _, err := s.Decide(ctx, algo.Check{Keys: []string{tc.keys(i)}, Meters: []algo.Meter{m}, Cost: 1}); err != nil {
					b.Fatal(err)
				}
			}
			before := readInfo(b, s.Client())
			i := 100
			for b.Loop() {
				i++
				if _, err := s.Decide(ctx, algo.Check{Keys: []string{tc.keys(i)}, Meters: []algo.Meter{m}, Cost: 1}); err != nil {
					b.Fatal(err)
				}
			}
			after := readInfo(b, s.Client())
			all := func(string) bool { return true }
			d0, d1 := before.Sum(all), after.Sum(all)
			b.ReportMetric((d1.Calls-d0.Calls-1)/float64(b.N), "redis-commands/decision") // less the INFO before
			b.ReportMetric((after.CPU-before.CPU)*1e6/float64(b.N), "redis-cpu-µs/decision")
		})
	}
}
