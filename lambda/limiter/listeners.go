package main

import (
	"context"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	grpchealth "google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/tollgate-dev/tollgate/shared/rlqs"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// listen listens on addr: host:port over TCP, or unix:PATH on a Unix socket
// (envoyproxy/ratelimit's GRPC_UDS).
func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return net.Listen("unix", path)
	}
	return net.Listen("tcp", addr)
}

// grpcOptions are the gRPC server's options: rls's, with envoyproxy/ratelimit's
// connection ages and TLS when its environment sets them.
func grpcOptions(c config) []grpc.ServerOption {
	opts := append(rls.ServerOptions(), rlqs.ServerOptions()...)
	if c.ERL.GRPCMaxAge > 0 {
		opts = append(opts, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: c.ERL.GRPCMaxAge, MaxConnectionAgeGrace: c.ERL.GRPCMaxAgeGrace}))
	}
	if c.ERL.GRPCTLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(c.ERL.GRPCTLS)))
	}
	return opts
}

// health is envoyproxy/ratelimit's health check: GET /healthcheck answers 200 "OK"
// while the service is healthy, 500 otherwise, and the gRPC health service says
// SERVING or NOT_SERVING, under the service names "" and "ratelimit". The service is
// unhealthy from SIGTERM on; with needConfig while no domain of the configuration
// directory is served; with redis while every Redis node's circuit breaker is open
// (Redis cannot be reached).
type health struct {
	needConfig, redis bool
	s                 *service
	stopping          atomic.Bool
	srv               atomic.Pointer[grpchealth.Server]
}

// ok reports whether the service is healthy now.
func (h *health) ok() bool {
	if h.stopping.Load() {
		return false
	}
	if h.needConfig && (h.s.erl == nil || h.s.erl.loaded() == 0) {
		return false
	}
	if h.redis && h.s.eng.BreakerState() == "open" {
		return false
	}
	return true
}

func (h *health) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if !h.ok() {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	w.Write([]byte("OK"))
}

// grpc returns the gRPC health service, whose status follows ok at each check.
func (h *health) grpc() healthpb.HealthServer {
	srv := grpchealth.NewServer()
	h.srv.Store(srv)
	return healthFunc{h: h, Server: srv}
}

// stop fails the health checks from now on.
func (h *health) stop() {
	h.stopping.Store(true)
	if srv := h.srv.Load(); srv != nil {
		srv.Shutdown()
	}
}

// healthFunc answers Check from health.ok, and Watch as grpc-go's health server.
type healthFunc struct {
	h *health
	*grpchealth.Server
}

func (f healthFunc) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if name := req.GetService(); name != "" && name != "ratelimit" {
		return f.Server.Check(ctx, req) // NOT_FOUND
	}
	st := healthpb.HealthCheckResponse_SERVING
	if !f.h.ok() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	return &healthpb.HealthCheckResponse{Status: st}, nil
}

// debugHandler serves what envoyproxy/ratelimit's debug port serves that tollgate
// has: /debug/pprof/, the metrics at /metrics (ERL's /stats is its statsd
// counters, which tollgate does not keep), and at /rlconfig the domains of the
// configuration directory served now.
func (s *service) debugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.Handle("/metrics", s.metrics)
	if s.erl != nil {
		mux.HandleFunc("/rlconfig", s.erl.describe)
	}
	mux.HandleFunc("/{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("/debug/pprof/: profiles\n/metrics: Prometheus metrics\n/rlconfig: the envoyproxy/ratelimit domains served\n"))
	})
	return mux
}
