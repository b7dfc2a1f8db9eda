// Package redisinfo reads what the benchmarks and tests measure Redis by: INFO commandstats
// (calls and time per command), INFO cpu (the process's CPU time) and any integer field
// of INFO (such as memory's used_memory).
package redisinfo

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// A Command is one command's line of INFO commandstats.
type Command struct {
	Calls float64
	// Usec is the time Redis spent running the command, in microseconds (a script's
	// includes the commands it ran, which have lines of their own too).
	Usec float64
}

// Stats is one reading of INFO commandstats and cpu.
type Stats struct {
	// Commands holds each command's line, by its name in commandstats without
	// "cmdstat_" (such as "fcall" or "function|load").
	Commands map[string]Command
	// CPU is used_cpu_user + used_cpu_sys, in seconds.
	CPU float64
}

// Read reads INFO commandstats and cpu from c.
func Read(ctx context.Context, c redis.UniversalClient) (Stats, error) {
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return Stats{}, fmt.Errorf("redisinfo: INFO: %w", err)
	}
	s := Stats{Commands: map[string]Command{}}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if cmd, ok := strings.CutPrefix(name, "cmdstat_"); ok {
			var c Command
			for _, kv := range strings.Split(rest, ",") {
				k, v, _ := strings.Cut(kv, "=")
				f, _ := strconv.ParseFloat(v, 64)
				switch k {
				case "calls":
					c.Calls = f
				case "usec":
					c.Usec = f
				}
			}
			s.Commands[cmd] = c
			continue
		}
		if name == "used_cpu_user" || name == "used_cpu_sys" {
			f, _ := strconv.ParseFloat(rest, 64)
			s.CPU += f
		}
	}
	return s, nil
}

// Sum adds up the lines of the commands keep accepts.
func (s Stats) Sum(keep func(name string) bool) Command {
	var t Command
	for name, c := range s.Commands {
		if keep(name) {
			t.Calls += c.Calls
			t.Usec += c.Usec
		}
	}
	return t
}

// Int reads the integer field name of INFO section from c, such as section "memory",
// name "used_memory".
func Int(ctx context.Context, c redis.Cmdable, section, name string) (int64, error) {
	info, err := c.Info(ctx, section).Result()
	if err != nil {
		return 0, fmt.Errorf("redisinfo: INFO %s: %w", section, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return 0, fmt.Errorf("redisinfo: INFO %s %s: %w", section, name, err)
			}
			return n, nil
		}
	}
	return 0, fmt.Errorf("redisinfo: INFO %s has no %s", section, name)
}
