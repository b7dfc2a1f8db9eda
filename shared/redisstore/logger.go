package redisstore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// UseLogger routes go-redis's own messages (failed dials, pool and Sentinel events),
// which it otherwise writes as plain text to standard error, into log at WARN with
// "from": "go-redis", so that a JSON log stays JSON. go-redis's logger is global:
// call it once, from main.
func UseLogger(log *slog.Logger) { redis.SetLogger(logger{log}) }

type logger struct{ log *slog.Logger }

func (l logger) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: "), "from", "go-redis")
}
