package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
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

// tlsRedis starts a redis-server that serves TLS only, with a certificate for name
// signed by a CA of its own, and returns its address and the CA's file.
func tlsRedis(t *testing.T, name string) (addr, caFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name}, DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	if ip := net.ParseIP(name); ip != nil {
		tmpl.DNSNames, tmpl.IPAddresses = nil, []net.IP{ip}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	write := func(name, typ string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	caFile = write("ca.pem", "CERTIFICATE", caDER)
	cert, keyFile := write("cert.pem", "CERTIFICATE", der), write("key.pem", "EC PRIVATE KEY", kder)
	port := freePort(t)
	redistest.StartServer(t, redistest.WithArgs("--tls-port", port, "--tls-cert-file", cert, "--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no"))
	return "127.0.0.1:" + port, caFile
}
