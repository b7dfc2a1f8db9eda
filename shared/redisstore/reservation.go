package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// PutReservation keeps value under key for ttl unless key holds one already (SET NX
// PX): the record of a reservation (engine.Reserve), which any instance can take. It
// reports whether the value was kept.
func (s *Store) PutReservation(ctx context.Context, key, value string, ttl time.Duration) (bool, error) {
	ok, err := s.client.SetNX(ctx, key, value, ttl).Result()
	if err != nil {
		return false, fmt.Errorf("redisstore: keep reservation %q: %w", key, err)
	}
	return ok, nil
}

// TakeReservation returns the value under key and deletes it in one command (GETDEL),
// so that of two instances that take the same reservation one gets it. It reports
// false when key holds nothing (never kept, taken already, or expired).
func (s *Store) TakeReservation(ctx context.Context, key string) (string, bool, error) {
	v, err := s.client.GetDel(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return "", false, nil
	}
	if err != nil {
		return "", false, fmt.Errorf("redisstore: take reservation %q: %w", key, err)
	}
	return v, true, nil
}
