package redisstore_test

import (
	"crypto/tls"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

func TestConfigOptions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		cfg         redisstore.Config
		wantAddrs   []string
		wantCluster bool
		wantMaster  string
		wantTLS     bool
		wantUser    string
		wantPass    string
		wantDB      int
	}{
		{name: "standalone", cfg: redisstore.Config{URL: "redis://127.0.0.1:6379"}, wantAddrs: []string{"127.0.0.1:6379"}},
		{name: "password and db", cfg: redisstore.Config{URL: "redis://u:p%40ss@h:6380/2"}, wantAddrs: []string{"h:6380"}, wantUser: "u", wantPass: "p@ss", wantDB: 2},
		{name: "tls", cfg: redisstore.Config{URL: "rediss://cache.example:6379"}, wantAddrs: []string{"cache.example:6379"}, wantTLS: true},
		{name: "cluster by query", cfg: redisstore.Config{URL: "redis://a:7000?addr=b:7001&addr=c:7002&cluster=true"}, wantAddrs: []string{"a:7000", "b:7001", "c:7002"}, wantCluster: true},
		{name: "cluster by flag", cfg: redisstore.Config{URL: "rediss://cfg.example:6379", Cluster: true}, wantAddrs: []string{"cfg.example:6379"}, wantCluster: true, wantTLS: true},
		{name: "sentinel", cfg: redisstore.Config{URL: "redis://s1:26379?addr=s2:26379&master_name=mymaster"}, wantAddrs: []string{"s1:26379", "s2:26379"}, wantMaster: "mymaster"},
		{name: "unix socket", cfg: redisstore.Config{URL: "unix://u:pw@/run/redis.sock?db=1"}, wantAddrs: []string{"/run/redis.sock"}, wantUser: "u", wantPass: "pw", wantDB: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o, err := tc.cfg.Options()
			if err != nil {
				t.Fatalf("Options(%q) error %v", tc.cfg.URL, err)
			}
			if strings.Join(o.Addrs, ",") != strings.Join(tc.wantAddrs, ",") || o.IsClusterMode != tc.wantCluster || o.MasterName != tc.wantMaster ||
				(o.TLSConfig != nil) != tc.wantTLS || o.Username != tc.wantUser || o.Password != tc.wantPass || o.DB != tc.wantDB {
				t.Errorf("Options(%q) = addrs %v cluster %v master %q tls %v user %q pass %q db %d, want %v %v %q %v %q %q %d",
					tc.cfg.URL, o.Addrs, o.IsClusterMode, o.MasterName, o.TLSConfig != nil, o.Username, o.Password, o.DB,
					tc.wantAddrs, tc.wantCluster, tc.wantMaster, tc.wantTLS, tc.wantUser, tc.wantPass, tc.wantDB)
			}
			// Nothing may retry a script: it could charge twice.
			if o.MaxRetries != -1 || o.MaxRedirects != -1 {
				t.Errorf("Options(%q) MaxRetries %d, MaxRedirects %d, want -1 and -1", tc.cfg.URL, o.MaxRetries, o.MaxRedirects)
			}
			if co := o.Cluster(); tc.wantCluster && (co.MaxRetries != -1 || co.MaxRedirects != -1) {
				t.Errorf("cluster options MaxRetries %d, MaxRedirects %d, want -1 and -1", co.MaxRetries, co.MaxRedirects)
			}
			if o.ReadTimeout != 100*time.Millisecond || !o.ContextTimeoutEnabled || o.ConnMaxLifetime != time.Hour {
				t.Errorf("Options(%q) timeouts %v, context %v, lifetime %v; want 100ms, true, 1h", tc.cfg.URL, o.ReadTimeout, o.ContextTimeoutEnabled, o.ConnMaxLifetime)
			}
		})
	}
	for _, bad := range []struct{ url, want string }{
		{"", "REDIS_URL is empty"},
		{"http://h:1", "scheme"},
		{"redis://h", "host:port"},
		{"redis://a:1?cluster=true&master_name=m", "exclusive"},
		{"redis://a:1/3?cluster=true", "database 0"},
		{"redis://%zz", "REDIS_URL"},
		{"unix:///run/redis.sock?cluster=true", "unexpected option: cluster"},
	} {
		if _, err := (redisstore.Config{URL: bad.url}).Options(); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Options(%q) error = %v, want one mentioning %q", bad.url, err, bad.want)
		}
	}
}

// TestUnixSocketAlone refuses a Unix socket as a cluster or with TLS.
func TestUnixSocketAlone(t *testing.T) {
	t.Parallel()
	for _, c := range []redisstore.Config{
		{URL: "unix:///run/redis.sock", Cluster: true},
		{URL: "unix:///run/redis.sock", TLSConfig: &tls.Config{}},
	} {
		if _, err := c.Options(); err == nil || !strings.Contains(err.Error(), "a Unix socket is one Redis") {
			t.Errorf("Options(%+v) error = %v, want one saying a Unix socket is one Redis", c, err)
		}
	}
}
