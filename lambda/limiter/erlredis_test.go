package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestERLRedisSettings decides with the service configured by ERL's Redis settings
// alone, on real Redis of each kind ERL reaches: a Unix socket with REDIS_AUTH as
// user:password, a cluster and a Sentinel given as comma lists, and TLS with
// REDIS_TLS_CACERT, verifying the server's name or (with
// REDIS_TLS_SKIP_HOSTNAME_VERIFICATION) only its chain. basic's one_per_minute
// admits one request and refuses the second, which only a shared Redis can say.
func TestERLRedisSettings(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "basic.yaml"), []byte(erlTestdata(t, "basic.yaml")), 0o644)
	cases := []struct {
		name string
		env  func(t *testing.T) map[string]string
	}{
		{"unix socket, user and password", func(t *testing.T) map[string]string {
			sock := filepath.Join(t.TempDir(), "redis.sock")
			redistest.StartServer(t, redistest.WithArgs("--unixsocket", sock, "--unixsocketperm", "700", "--user", "alice", "on", ">s3cret", "~*", "&*", "+@all"))
			return map[string]string{"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": sock, "REDIS_AUTH": "alice:s3cret"}
		}},
		{"password only", func(t *testing.T) map[string]string {
			srv := redistest.StartServer(t, redistest.WithArgs("--requirepass", "pw"))
			return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "REDIS_AUTH": "pw"}
		}},
		{"cluster", func(t *testing.T) map[string]string {
			c := redistest.StartCluster(t)
			return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "cluster", "REDIS_URL": strings.Join(c.Addrs, ",")}
		}},
		{"sentinel", func(t *testing.T) map[string]string {
			s := redistest.StartSentinel(t)
			var addrs []string
			for _, sn := range s.Sentinels() {
				addrs = append(addrs, sn.Addr)
			}
			return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_TYPE": "sentinel", "REDIS_URL": redistest.MasterName + "," + strings.Join(addrs, ",")}
		}},
		{"TLS with a CA", func(t *testing.T) map[string]string {
			addr, ca := tlsRedis(t, "127.0.0.1")
			return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": addr, "REDIS_TLS": "true", "REDIS_TLS_CACERT": ca}
		}},
		{"TLS, another name, hostname not verified", func(t *testing.T) map[string]string {
			addr, ca := tlsRedis(t, "redis.internal")
			return map[string]string{"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": addr, "REDIS_TLS": "true", "REDIS_TLS_CACERT": ca, "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION": "true"}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := tc.env(t)
			e["RUNTIME_ROOT"], e["RUNTIME_SUBDIRECTORY"], e["RUNTIME_APPDIRECTORY"] = filepath.Dir(dir), ".", filepath.Base(dir)
			c, err := loadConfig(env(e), nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			body := `{"domain": "basic", "descriptors": [{"entries": [{"key": "one_per_minute", "value": "` + tc.name + `"}]}]}`
			for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
				rec := httptest.NewRecorder()
				s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
				if rec.Code != want {
					t.Fatalf("request %d under one a minute = %d %s, want %d", i+1, rec.Code, rec.Body, want)
				}
			}
		})
	}

	// A server whose name is not the certificate's, with the name verified: refused.
	addr, ca := tlsRedis(t, "redis.internal")
	c, err := loadConfig(env(map[string]string{"RUNTIME_ROOT": filepath.Dir(dir), "RUNTIME_SUBDIRECTORY": ".", "RUNTIME_APPDIRECTORY": filepath.Base(dir),
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": addr, "REDIS_TLS": "true", "REDIS_TLS_CACERT": ca}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil {
		rec := httptest.NewRecorder()
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain": "basic", "descriptors": [{"entries": [{"key": "key1", "value": "x"}]}]}`)))
		s.Close()
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("decision on a server whose certificate names another host = %d %s, want 503 (TLS refused)", rec.Code, rec.Body)
		}
	}
}

// testCA is a certificate authority of a test's own, writing PEM files into dir.
type testCA struct {
	t    *testing.T
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	file string // the CA's certificate
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	ca := &testCA{t: t, dir: t.TempDir()}
	ca.key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &ca.key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	ca.cert, _ = x509.ParseCertificate(der)
	ca.file = ca.write("ca.pem", "CERTIFICATE", der)
	return ca
}

func (ca *testCA) write(name, typ string, b []byte) string {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
		ca.t.Fatal(err)
	}
	return p
}

// issue writes a certificate for name (a host name or an IP address), for usage,
// and its key, and returns their files.
func (ca *testCA) issue(name string, usage x509.ExtKeyUsage) (cert, key string) {
	ca.t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.IPAddresses = []net.IP{ip}
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(k)
	return ca.write(name+".pem", "CERTIFICATE", der), ca.write(name+"-key.pem", "EC PRIVATE KEY", kder)
}

// tlsRedis starts a redis-server that serves TLS only, with a certificate for name
// signed by a CA of its own, and returns its address and the CA's file.
func tlsRedis(t *testing.T, name string) (addr, caFile string) {
	t.Helper()
	ca := newTestCA(t)
	cert, key := ca.issue(name, x509.ExtKeyUsageServerAuth)
	port := freePort(t)
	redistest.StartServer(t, redistest.WithArgs("--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca.file, "--tls-auth-clients", "no"))
	return "127.0.0.1:" + port, ca.file
}

// TestERLGRPCServerTLS serves gRPC over TLS from ERL's GRPC_SERVER_USE_TLS
// settings, requiring clients to present a certificate of GRPC_CLIENT_TLS_CACERT's
// CA for GRPC_CLIENT_TLS_SAN: such a client is answered; one without a
// certificate, or with one for another name, is not.
func TestERLGRPCServerTLS(t *testing.T) {
	t.Parallel()
	ca := newTestCA(t)
	serverCert, serverKey := ca.issue("127.0.0.1", x509.ExtKeyUsageServerAuth)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "basic.yaml"), []byte(erlTestdata(t, "basic.yaml")), 0o644)
	c, err := loadConfig(env(map[string]string{"RUNTIME_ROOT": filepath.Dir(dir), "RUNTIME_SUBDIRECTORY": ".", "RUNTIME_APPDIRECTORY": filepath.Base(dir),
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": serverCert, "GRPC_SERVER_TLS_KEY": serverKey,
		"GRPC_CLIENT_TLS_CACERT": ca.file, "GRPC_CLIENT_TLS_SAN": "envoy.client"}), []string{"--redis", "", "--grpc-listen", "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, c)
	addr := serveGRPC(t, c, s)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	for _, tc := range []struct {
		name   string
		client string // the client certificate's name; empty: none
		ok     bool
	}{
		{"the SAN's certificate", "envoy.client", true},
		{"another name's certificate", "intruder.client", false},
		{"no certificate", "", false},
	} {
		cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
		if tc.client != "" {
			cert, key := ca.issue(tc.client, x509.ExtKeyUsageClientAuth)
			pair, err := tls.LoadX509KeyPair(cert, key)
			if err != nil {
				t.Fatal(err)
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := ask(t, rlsv3.NewRateLimitServiceClient(conn), "basic", 1, "key1", tc.name)
		conn.Close()
		if ok := err == nil && r.OverallCode == rlsv3.RateLimitResponse_OK; ok != tc.ok {
			t.Errorf("%s: ShouldRateLimit = %v, %v; want answered %v", tc.name, r, err, tc.ok)
		}
	}
}
