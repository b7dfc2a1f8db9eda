package redisstore_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// TestUseLoggerRoutesGoRedisMessages checks that go-redis's own message about a
// failed dial reaches the slog logger as a JSON line from go-redis, not plain text
// on standard error.
func TestUseLoggerRoutesGoRedisMessages(t *testing.T) {
	var buf bytes.Buffer
	redisstore.UseLogger(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() { redisstore.UseLogger(slog.New(slog.DiscardHandler)) })

	// A port that refuses connections: listen, note the address, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + addr, DialTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := st.Client().Ping(ctx).Err(); err == nil {
		t.Fatal("ping of a closed port succeeded")
	}
	if buf.Len() == 0 {
		t.Fatal("go-redis wrote nothing through the logger")
	}
	for _, line := range bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n")) {
		var rec map[string]any
		if err := json.Unmarshal(line, &rec); err != nil {
			t.Fatalf("not a JSON log line: %q", line)
		}
		if rec["from"] != "go-redis" || rec["level"] != "WARN" {
			t.Errorf("line %s: want from=go-redis at WARN", line)
		}
	}
}
