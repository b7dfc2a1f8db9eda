package memstore

import (
	"context"
	"errors"
	"time"
)

var errFull = errors.New("memstore: reservations full: every kept reservation is still live")

// A reservation is one record kept by PutReservation.
type reservation struct {
	value   string
	expires time.Time
}

// PutReservation keeps value under key for ttl unless key holds one already, as
// redisstore's does in Redis; it reports whether the value was kept. Expired records
// are dropped as new ones come, at most MaxKeys of them kept.
func (s *Store) PutReservation(_ context.Context, key, value string, ttl time.Duration) (bool, error) {
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reserved == nil {
		s.reserved = map[string]reservation{}
	}
	if r, ok := s.reserved[key]; ok && now.Before(r.expires) {
		return false, nil
	}
	if len(s.reserved) >= s.max {
		for k, r := range s.reserved {
			if !now.Before(r.expires) {
				delete(s.reserved, k)
			}
		}
		if len(s.reserved) >= s.max {
			return false, errFull
		}
	}
	s.reserved[key] = reservation{value: value, expires: now.Add(ttl)}
	return true, nil
}

// TakeReservation returns the value under key and deletes it; false when key holds
// nothing (never kept, taken already, or expired).
func (s *Store) TakeReservation(_ context.Context, key string) (string, bool, error) {
	now := s.clock()
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.reserved[key]
	delete(s.reserved, key)
	if !ok || !now.Before(r.expires) {
		return "", false, nil
	}
	return r.value, true, nil
}
