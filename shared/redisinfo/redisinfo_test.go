package redisinfo_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestRead counts commands between two readings of a real redis-server: three SETs
// and a GET show up by name, Sum adds the lines it is asked for, and CPU time is read.
func TestRead(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { _ = c.Close() })
	before, err := redisinfo.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		c.Set(ctx, "k", "v", 0)
	}
	c.Get(ctx, "k")
	after, err := redisinfo.Read(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	if got := after.Commands["set"].Calls - before.Commands["set"].Calls; got != 3 {
		t.Errorf("set calls between the readings = %v, want 3", got)
	}
	setOrGet := func(name string) bool { return name == "set" || name == "get" }
	if got := after.Sum(setOrGet).Calls - before.Sum(setOrGet).Calls; got != 4 {
		t.Errorf("set and get calls = %v, want 4", got)
	}
	if after.CPU <= 0 || after.Commands["set"].Usec <= 0 {
		t.Errorf("CPU %v s, set %v µs; want both above 0", after.CPU, after.Commands["set"].Usec)
	}
}

// TestInt reads an integer field of a real redis-server's INFO, and names a field it
// lacks.
func TestInt(t *testing.T) {
	ctx := context.Background()
	c := redistest.StartServer(t).Client(t)
	if n, err := redisinfo.Int(ctx, c, "memory", "used_memory"); err != nil || n <= 0 {
		t.Errorf("Int(memory, used_memory) = %d, %v; want above 0", n, err)
	}
	if _, err := redisinfo.Int(ctx, c, "memory", "no_such_field"); err == nil || !strings.Contains(err.Error(), "no_such_field") {
		t.Errorf("Int(memory, no_such_field) = %v, want an error naming the field", err)
	}
}
