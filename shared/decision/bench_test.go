package decision_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

func benchHandler(b *testing.B, st engine.Store) http.Handler {
	b.Helper()
	p, err := policy.Parse([]byte("domain: bench\nshard_by: api_key\nfailure: {mode: closed, timeout: 5s}\nrules:\n  - name: r\n    match: {api_key: \"*\"}\n    limits:\n      - {algorithm: gcra, rate: 1000000/s}\n"))
	if err != nil {
		b.Fatal(err)
	}
	e, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		b.Fatal(err)
	}
	return decision.NewHandler(e, decision.Options{})
}

func benchBodies(n int) [][]byte {
	bodies := make([][]byte, n)
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"domain":"bench","attributes":{"api_key":"client-%06d"},"cost":1}`, i)
	}
	return bodies
}

// BenchmarkHandlerInProcess is the HTTP layer's own cost (JSON in and out, headers)
// around the engine with its in-process store: no network, no Redis.
func BenchmarkHandlerInProcess(b *testing.B) {
	h := benchHandler(b, nil)
	bodies := benchBodies(10000)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		req := httptest.NewRequest(http.MethodPost, "/v1/check", bytes.NewReader(bodies[i%len(bodies)]))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("POST /v1/check = %d %s", w.Code, w.Body)
		}
	}
}

// benchStores starts a redis-server and returns a store on it, scripts loaded, and
// a store on the same client that batches with the defaults; both close when b ends.
func benchStores(b *testing.B) (*redisstore.Store, *redisstore.Store) {
	b.Helper()
	srv := redistest.StartServer(b)
	s, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	if err := s.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	bt, err := redisstore.NewWithOptions(s.Client(), redisstore.Options{BatchWait: redisstore.DefaultBatchWait})
	if err != nil {
		b.Fatal(err)
	}
	return s, bt
}

// BenchmarkLoopback is one POST /v1/check at a time over loopback HTTP to the
// decision service on Redis, with the engine on the batcher (the service's default)
// or on the store.
func BenchmarkLoopback(b *testing.B) {
	s, bt := benchStores(b)
	bodies := benchBodies(10000)
	for _, st := range []struct {
		name  string
		store engine.Store
	}{{"batcher", bt}, {"store", s}} {
		b.Run(st.name, func(b *testing.B) {
			ts := httptest.NewServer(benchHandler(b, st.store))
			defer ts.Close()
			client := ts.Client()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				i++
				resp, err := client.Post(ts.URL+"/v1/check", "application/json", bytes.NewReader(bodies[i%len(bodies)]))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("POST /v1/check = %s", resp.Status)
				}
			}
		})
	}
}

// BenchmarkLoopbackRaw is BenchmarkLoopback with a lean HTTP/1.1 client, as a proxy
// calls the service: one kept-alive connection, the request written and the response
// read by the calling goroutine, without net/http's transport goroutines.
func BenchmarkLoopbackRaw(b *testing.B) {
	_, bt := benchStores(b)
	ts := httptest.NewServer(benchHandler(b, bt))
	defer ts.Close()
	conn, err := net.Dial("tcp", ts.Listener.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	bodies := benchBodies(10000)
	reqs := make([][]byte, len(bodies))
	for i, body := range bodies {
		reqs[i] = fmt.Appendf(nil, "POST /v1/check HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if _, err := conn.Write(reqs[i%len(reqs)]); err != nil {
			b.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("POST /v1/check = %s", resp.Status)
		}
	}
}
