package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// serverMicros reads the Redis server's clock, the clock the scripts decide with.
func (s *Store) serverMicros(ctx context.Context) (int64, error) {
	t, err := s.client.Time(ctx).Result()
	if err != nil {
		return 0, fmt.Errorf("redisstore: TIME: %w", err)
	}
	return t.UnixMicro(), nil
}

// fixedWindowKey is the key of the current window of a fixed_window meter at now (µs).
func fixedWindowKey(key string, m algo.Meter, now int64) string {
	name, _ := m.Limits[0].WindowKey(key, now)
	return name
}

// Records returns the values recorded with the admitted requests that still count:
// the live entries of a sliding_log, the current window of a fixed_window.
func (s *Store) Records(ctx context.Context, key string, m algo.Meter) (map[string]int64, error) {
	now, err := s.serverMicros(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	switch m.Algorithm() {
	case algo.SlidingLog:
		p := int64(m.Limits[0].Period / time.Microsecond)
		members, err := s.client.ZRangeByScore(ctx, key, &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now-p, 10), Max: "+inf"}).Result()
		if err != nil {
			return nil, fmt.Errorf("redisstore: records of %q: %w", key, err)
		}
		for _, mem := range members {
			// "<time>:<seq>:<value>"; entries without a value recorded none.
			parts := strings.SplitN(mem, ":", 3)
			if len(parts) == 3 {
				out[parts[2]]++
			}
		}
	case algo.FixedWindow:
		vals, err := s.client.HGetAll(ctx, fixedWindowKey(key, m, now)+":r").Result()
		if err != nil {
			return nil, fmt.Errorf("redisstore: records of %q: %w", key, err)
		}
		for k, v := range vals {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("redisstore: records of %q: value %q of %q is not a count", key, v, k)
			}
			out[k] = n
		}
	}
	return out, nil
}

// Reset deletes the state of meters at keys (one DEL per key, so it works across
// cluster slots).
func (s *Store) Reset(ctx context.Context, keys []string, meters []algo.Meter) error {
	now, err := s.serverMicros(ctx)
	if err != nil {
		return err
	}
	for i, k := range keys {
		del := []string{k}
		if meters[i].Algorithm() == algo.FixedWindow {
			cur := fixedWindowKey(k, meters[i], now)
			del = append(del, cur, cur+":r")
		}
		for _, d := range del {
			if err := s.client.Del(ctx, d).Err(); err != nil {
				return fmt.Errorf("redisstore: reset %q: %w", d, err)
			}
		}
	}
	return nil
}
