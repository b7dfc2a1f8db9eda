package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
)

// memRow is the Redis memory that tracking one client costs, per algorithm.
type memRow struct {
	Name    string `json:"name"`
	Clients int    `json:"clients"`
	// Keys is the number of keys the clients left in Redis.
	Keys int64 `json:"keys"`
	// PerClient is the growth of INFO used_memory divided by the clients, in bytes:
	// keys, values, TTLs and the dictionaries' share.
	PerClient float64 `json:"used_memory_per_client"`
	// Usage is the mean MEMORY USAGE of a sample of the keys (per client: times the
	// keys per client).
	Usage float64 `json:"memory_usage_per_client"`
}

// floorRow names the memory row of a bare key with a TTL.
const floorRow = "floor: SET key PX"

// memLimit is the limit of the memory runs: 100 a day, so that no key expires while
// the run fills Redis (a gcra key lives 864s after one request).
func memLimit(a algo.Algorithm) string {
	return fmt.Sprintf("{algorithm: %s, rate: 100/day}", a)
}

// measureMemory makes one decision for each of n clients with every algorithm (and
// with redis_rate, for reference) and reports the memory it takes.
func measureMemory(ctx context.Context, e *env, n int, step func(string)) ([]memRow, error) {
	var rows []memRow
	ids := make([]string, n)
	attrs := make([]map[string]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("client-%06d", i)
		attrs[i] = map[string]string{"api_key": ids[i]}
	}
	names := append([]string{"redis_rate", floorRow}, algoNames()...)
	for _, name := range names {
		step("memory/" + name)
		var decide func(ctx context.Context, i int) error
		switch name {
		case floorRow:
			// The least a limiter keeping one timestamp per client can pay: a SET with a TTL of
			// a 16-digit integer (a gcra TAT) under tollgate's own key name.
			eng, err := e.newEngine(batchStore, false, memLimit(algo.GCRA))
			if err != nil {
				return nil, err
			}
			decide = func(ctx context.Context, i int) error {
				keys, _, err := eng.Keys("bench", attrs[i])
				if err != nil || len(keys) != 1 {
					return fmt.Errorf("keys %v: %v", keys, err)
				}
				return e.client.Set(ctx, keys[0], "1732270000123456", 24*time.Hour).Err()
			}
		case "redis_rate":
			lim := redis_rate.NewLimiter(e.client)
			decide = func(ctx context.Context, i int) error {
				_, err := lim.Allow(ctx, ids[i], redis_rate.Limit{Rate: 100, Burst: 100, Period: 24 * time.Hour})
				return err
			}
		default:
			eng, err := e.newEngine(batchStore, false, memLimit(algo.Algorithm(name)))
			if err != nil {
				return nil, err
			}
			decide = func(ctx context.Context, i int) error {
				v, err := eng.Check(ctx, engine.Request{Domain: "bench", Attributes: attrs[i], Cost: 1})
				if err == nil && (v.Degraded || !v.Allowed) {
					err = fmt.Errorf("verdict %+v", v)
				}
				return err
			}
		}
		row, err := memoryOf(ctx, e.client, name, n, decide)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func algoNames() []string {
	var s []string
	for _, a := range algo.Algorithms {
		s = append(s, string(a))
	}
	return s
}

func memoryOf(ctx context.Context, c redis.UniversalClient, name string, n int, decide func(context.Context, int) error) (memRow, error) {
	row := memRow{Name: name, Clients: n}
	// A first pass over a few clients gives every connection its buffers, so that
	// they do not count as the clients' memory.
	if err := decideAll(ctx, name, min(n, 256), decide); err != nil {
		return row, err
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		return row, err
	}
	_ = c.Do(ctx, "MEMORY", "PURGE").Err()
	before, err := usedMemory(ctx, c)
	if err != nil {
		return row, err
	}
	if err := decideAll(ctx, name, n, decide); err != nil {
		return row, err
	}
	after, err := usedMemory(ctx, c)
	if err != nil {
		return row, err
	}
	row.PerClient = float64(after-before) / float64(n)
	if row.Keys, err = c.DBSize(ctx).Result(); err != nil {
		return row, err
	}
	// MEMORY USAGE of a sample of keys.
	keys, _, err := c.Scan(ctx, 0, "*", 200).Result()
	if err != nil {
		return row, err
	}
	var sum, cnt float64
	for _, k := range keys {
		u, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			continue
		}
		sum += float64(u)
		cnt++
	}
	if cnt > 0 {
		row.Usage = sum / cnt * float64(row.Keys) / float64(n)
	}
	return row, c.FlushAll(ctx).Err()
}

// decideAll decides once for each of clients 0 to n-1, with 32 workers.
func decideAll(ctx context.Context, name string, n int, decide func(context.Context, int) error) error {
	const workers = 32
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < n; i += workers {
				dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				err := decide(dctx, i)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("bench: memory/%s: %w", name, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	return <-errs
}

func usedMemory(ctx context.Context, c redis.UniversalClient) (int64, error) {
	n, err := redisinfo.Int(ctx, c, "memory", "used_memory")
	if err != nil {
		return 0, fmt.Errorf("bench: %w", err)
	}
	return n, nil
}
