package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// The replay of envoyproxy/ratelimit's own configuration tests (its
// test/config/config_test.go, on its files in ../erl/testdata/erl-config): every file
// loads or is refused as ERL's tests say, and every GetLimit assertion of the tests
// named basic, override, shadow mode, wildcard, share threshold and domain merge is
// asked over gRPC (ShouldRateLimit) of a service on a real Redis, its answer checked
// as ERL's service gives it.

const erlConfigDir = "../erl/testdata/erl-config"

// erlFiles reads ERL's test files named.
func erlFiles(t testing.TB, names ...string) []erl.File {
	t.Helper()
	var fs []erl.File
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(erlConfigDir, n))
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, erl.File{Name: n, Data: b})
	}
	return fs
}

// loadERL translates files as ERL loads a directory (merge: MERGE_DOMAIN_CONFIG)
// and returns the service of their domains, on store.
func loadERL(files []erl.File, merge bool, store engine.Store) (*rls.Server, error) {
	trs, err := erl.TranslateFiles(files, merge)
	if err != nil {
		return nil, err
	}
	domains := map[string]rls.Domain{}
	for _, tr := range trs {
		p, err := policy.Parse(tr.Policy)
		if err != nil {
			return nil, fmt.Errorf("the translation of domain %s does not parse: %w\n%s", tr.Domain, err, tr.Policy)
		}
		patient(p)
		eng, err := engine.New(engine.Config{Policy: p, Store: store})
		if err != nil {
			return nil, err
		}
		domains[tr.Domain] = rls.ERLDomain(tr, eng)
	}
	return rls.NewDomains(domains, nil), nil
}

// replayCounter counts the cases of the replay that ran, and those that failed.
type replayCounter struct{ cases, failed int }

func (c *replayCounter) check(t *testing.T, ok bool, format string, args ...any) {
	t.Helper()
	c.cases++
	if !ok {
		c.failed++
		t.Errorf(format, args...)
	}
}

// TestERLConfigLoads loads every file of ERL's test/config, alone or with the files
// its tests load it with, and wants it loaded, or refused for ERL's reason (in
// tollgate's words), as ERL's tests want.
func TestERLConfigLoads(t *testing.T) {
	t.Parallel()
	var n replayCounter
	for _, tc := range []struct {
		files  []string
		merge  bool
		refuse string // "" to load; else a part of tollgate's reason
		erl    string // ERL's reason, as its test wants it
	}{
		{[]string{"basic_config.yaml"}, false, "", ""},
		{[]string{"shadowmode_config.yaml"}, false, "", ""},
		{[]string{"wildcard.yaml"}, false, "", ""},
		{[]string{"share_threshold.yaml"}, false, "", ""},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, true, "", ""},
		// A domain of no descriptors loads (ERL loads it; its test loads it beside another).
		{[]string{"duplicate_domain.yaml"}, false, "", ""},
		{[]string{"empty_domain.yaml"}, false, "domain is empty", "config file cannot have empty domain"},
		{[]string{"basic_config.yaml", "duplicate_domain.yaml"}, false, `duplicate_domain.yaml: erl: domain "test-domain" is in another file too`, "duplicate domain 'test-domain' in config file"},
		{[]string{"empty_key.yaml"}, false, "key is empty", "descriptor has empty key"},
		{[]string{"duplicate_key.yaml"}, false, `key "key1" value "value1" appears twice`, "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{[]string{"merge_domain_key1.yaml", "merge_domain_key1.yaml"}, true, `key "key1" value "value1" is in merge_domain_key1.yaml too`, "duplicate descriptor composite key 'test-domain.key1_value1'"},
		{[]string{"bad_limit_unit.yaml"}, false, `a unit of second, minute, hour, day, week, month or year (got 5 per "foo")`, "invalid rate limit unit 'foo'"},
		{[]string{"replaces_self.yaml"}, false, `rate_limit "self" replaces itself`, "replaces should not contain name of same descriptor"},
		{[]string{"replaces_empty.yaml"}, false, "rate_limit.replaces[0] has no name", "should not have an empty replaces entry"},
		{[]string{"bad_yaml.yaml"}, false, "found unexpected end of stream", "error loading config file: yaml: line 2: found unexpected end of stream"},
		{[]string{"misspelled_key.yaml"}, false, "field ratelimit not found", "config error, unknown key 'ratelimit'"},
		{[]string{"misspelled_key2.yaml"}, false, "field requestsperunit not found", "config error, unknown key 'requestsperunit'"},
		{[]string{"non_string_key.yaml"}, false, "field 0.25 not found", "config error, key is not of type string: 0.25"},
		{[]string{"non_map_list.yaml"}, false, "cannot unmarshal !!str `a`", "config error, yaml file contains list of type other than map: a"},
		{[]string{"unlimited_with_unit.yaml"}, false, `rate_limit is unlimited and has unit "day"`, "should not specify rate limit unit when unlimited"},
	} {
		_, err := loadERL(erlFiles(t, tc.files...), tc.merge, nil)
		if tc.refuse == "" {
			n.check(t, err == nil, "%v (merge %v): %v, want it loaded, as ERL loads it", tc.files, tc.merge, err)
			continue
		}
		n.check(t, err != nil && strings.Contains(err.Error(), tc.refuse), "%v (merge %v): %v, want it refused with %q (ERL: %q)", tc.files, tc.merge, err, tc.refuse, tc.erl)
	}
	t.Logf("ERL config loads: %d of %d cases as ERL", n.cases-n.failed, n.cases)
}

// A lookup is one GetLimit assertion of ERL's tests: a descriptor of a domain (with a
// limit of its own, for the override test), and the limit ERL's GetLimit returns for
// it, which its service answers with.
type lookup struct {
	domain   string
	entries  []string // key, value, key, value…
	override *rlv3.RateLimitDescriptor_RateLimitOverride
	// want: nil for no limit (OK, no current_limit); else the limit.
	want *erlLimit
}

type erlLimit struct {
	per       uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	name      string
	unlimited bool // OK, no current_limit, 4294967295 remaining
	shadow    bool // over it: OK, with the limit and 0 remaining
}

var (
	second = rlsv3.RateLimitResponse_RateLimit_SECOND
	minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
	hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
	day    = rlsv3.RateLimitResponse_RateLimit_DAY
)

func limit(per uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit) *erlLimit {
	return &erlLimit{per: per, unit: unit}
}

func td(entries ...string) lookup { return lookup{domain: "test-domain", entries: entries} }

// ask asks l of c and checks the answer as ERL's service gives it: the limit, or OK
// with none; then, for a limit, a request of hits_addend one above it, which ERL
// answers OVER_LIMIT with 0 remaining, or OK with 0 remaining for a shadow limit.
// Each answer checked is a case of n; one not asked (the first failed) fails too.
func ask(t *testing.T, c rlsv3.RateLimitServiceClient, n *replayCounter, what string, l lookup) {
	t.Helper()
	d := descriptor(l.entries...)
	d.Limit = l.override
	if l.want != nil && l.want.unit == second {
		// The call and the one over the limit after it count in one window.
		inOneWindow(time.Second, 500*time.Millisecond)
	}
	resp, err := c.ShouldRateLimit(context.Background(), request(l.domain, d))
	if err != nil {
		n.check(t, false, "%s: %v", what, err)
		n.skip(cases(l) - 1)
		return
	}
	st := resp.Statuses[0]
	switch w := l.want; {
	case w == nil:
		n.check(t, resp.OverallCode == rlsv3.RateLimitResponse_OK && st.GetCode() == rlsv3.RateLimitResponse_OK && st.CurrentLimit == nil && st.LimitRemaining == 0,
			"%s: %v, want OK with no limit (ERL's GetLimit: nil)", what, resp)
		return
	case w.unlimited:
		n.check(t, resp.OverallCode == rlsv3.RateLimitResponse_OK && st.CurrentLimit == nil && st.LimitRemaining == 1<<32-1,
			"%s: %v, want OK with no limit and 4294967295 remaining (ERL's unlimited)", what, resp)
		return
	}
	got := st.GetCurrentLimit()
	if !n.checked(t, resp.OverallCode == rlsv3.RateLimitResponse_OK && got.GetRequestsPerUnit() == l.want.per && got.GetUnit() == l.want.unit && got.GetName() == l.want.name && st.LimitRemaining == l.want.per-1,
		"%s: %v, want OK under %d per %v named %q, %d remaining", what, resp, l.want.per, l.want.unit, l.want.name, l.want.per-1) {
		n.skip(1)
		return
	}
	// One above what remains: over it.
	over := request(l.domain, d)
	over.HitsAddend = l.want.per
	resp, err = c.ShouldRateLimit(context.Background(), over)
	if err != nil {
		n.check(t, false, "%s over: %v", what, err)
		return
	}
	st = resp.Statuses[0]
	code := rlsv3.RateLimitResponse_OVER_LIMIT
	if l.want.shadow {
		code = rlsv3.RateLimitResponse_OK
	}
	n.check(t, resp.OverallCode == code && st.GetCode() == code && st.GetCurrentLimit().GetRequestsPerUnit() == l.want.per && st.LimitRemaining == 0,
		"%s, %d hits more: %v, want %v with the limit and 0 remaining (shadow_mode %v)", what, l.want.per, resp, code, l.want.shadow)
}

// skip counts k cases that could not be asked as failed.
func (c *replayCounter) skip(k int) { c.cases, c.failed = c.cases+k, c.failed+k }

// cases is the number of answers ask checks for l: the limit, and over it.
func cases(l lookup) int {
	if l.want == nil || l.want.unlimited {
		return 1
	}
	return 2
}

// checked is check that also returns ok.
func (c *replayCounter) checked(t *testing.T, ok bool, format string, args ...any) bool {
	t.Helper()
	c.check(t, ok, format, args...)
	return ok
}

// TestERLConfigLookups replays the GetLimit assertions of ERL's TestBasicConfig,
// TestDomainMerge, TestConfigLimitOverride, TestShadowModeConfig, TestWildcardConfig
// and TestShareThreshold over gRPC on a real Redis.
func TestERLConfigLookups(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	var total replayCounter
	override := func(l lookup, per uint32, unit typev3.RateLimitUnit) lookup {
		l.override = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: per, Unit: unit}
		return l
	}
	want := func(l lookup, w *erlLimit) lookup { l.want = w; return l }
	shadow := func(w *erlLimit) *erlLimit { w.shadow = true; return w }
	named := func(w *erlLimit, name string) *erlLimit { w.name = name; return w }
	groups := []struct {
		test    string
		files   []string
		merge   bool
		lookups []lookup
		// shared lists descriptors (key, value) that ERL counts as one: asked one
		// after another, each has one less remaining.
		shared [][]string
	}{
		{"TestBasicConfig", []string{"basic_config.yaml"}, false, []lookup{
			{domain: "foo_domain"},
			td(),
			td("key1", "something"),
			td("key1", "value1"),
			td("key2", "value2", "subkey", "subvalue"),
			td("key5", "value5", "subkey5", "subvalue"),
			want(td("key1", "value1", "subkey1", "something"), limit(5, second)),
			want(td("key1", "value1", "subkey1", "subvalue1"), limit(10, second)),
			want(td("key2", "something"), limit(20, minute)),
			want(td("key2", "value2"), limit(30, minute)),
			td("key2", "value3"),
			want(td("key3", "foo"), limit(1, hour)),
			want(td("key4", "foo"), named(limit(1, day), "key4_rate_limit")),
			want(td("key6", "foo"), &erlLimit{unlimited: true}),
			want(td("key7", "unspecified_value"), limit(70, minute)),
			want(td("key7", "another_value"), limit(70, minute)),
		}, nil},
		{"TestDomainMerge", []string{"merge_domain_key1.yaml", "merge_domain_key2.yaml"}, true, []lookup{
			{domain: "foo_domain"},
			td(),
			want(td("key1", "value1"), limit(10, minute)),
			want(td("key2", "value2"), limit(20, minute)),
		}, nil},
		{"TestConfigLimitOverride", []string{"basic_config.yaml"}, false, []lookup{
			override(lookup{domain: "foo_domain"}, 10, typev3.RateLimitUnit_DAY),
			want(override(td("key1", "value1", "subkey1", "something"), 10, typev3.RateLimitUnit_DAY), limit(10, day)),
			want(override(td("key1", "value1", "subkey1", "something"), 42, typev3.RateLimitUnit_HOUR), limit(42, hour)),
			want(override(td("key1", "value1", "subkey1", "something_else"), 42, typev3.RateLimitUnit_HOUR), limit(42, hour)),
		}, nil},
		{"TestShadowModeConfig", []string{"shadowmode_config.yaml"}, false, []lookup{
			want(td("key1", "value1", "subkey1", "something"), limit(5, second)),
			want(td("key1", "value1", "subkey1", "subvalue1"), shadow(limit(10, second))),
			want(td("key2", "something"), shadow(limit(20, minute))),
			want(td("key2", "value2"), limit(30, minute)),
		}, nil},
		{"TestWildcardConfig", []string{"wildcard.yaml"}, false, []lookup{
			want(td("noVal", "foo1"), limit(20, minute)),
			want(td("noVal", "foo2"), limit(20, minute)),
			want(td("wild", "foo1"), limit(20, minute)),
			want(td("wild", "foo2"), limit(20, minute)),
			want(td("nestedWild", "val1", "wild", "goo2"), limit(20, minute)),
			td("wild", "bar"),
			td("noWild", "foo1"),
			td("midWildcard", "barab"),
		}, nil},
		{"TestShareThreshold", []string{"share_threshold.yaml"}, false, []lookup{
			want(td("route", "api/v1", "method", "GET"), limit(60, minute)),
			want(td("service", "svc/user", "endpoint", "get"), limit(80, minute)),
			want(td("nested", "parent", "files", "nested/file1.txt"), limit(200, minute)),
			want(td("files", "top/file1.txt", "files", "nested/file1.txt"), limit(300, minute)),
			want(td("path", "path/foo", "file", "file/doc1", "type", "pdf"), limit(120, minute)),
			want(td("user", "user/alice", "resource", "res/file1", "action", "read"), limit(150, minute)),
			want(td("file", "test1"), limit(50, minute)),
		}, [][]string{
			{"files", "files/a.pdf", "files", "files/b.csv", "files", "files/c.txt"},
			{"file", "test2", "file", "test23", "file", "test123"},
		}},
	}
	for _, g := range groups {
		t.Run(g.test, func(t *testing.T) {
			var n replayCounter
			st, err := redisstore.Open(redisstore.Config{URL: "redis://" + srv.Addr, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			s, err := loadERL(erlFiles(t, g.files...), g.merge, st)
			if err != nil {
				// Every case of the group fails.
				for _, l := range g.lookups {
					n.skip(cases(l))
				}
				for _, kv := range g.shared {
					n.skip(len(kv) / 2)
				}
				total.cases += n.cases
				total.failed += n.failed
				t.Fatalf("%s: %d cases not asked: %v", g.test, n.cases, err)
			}
			c := serve(t, s)
			for i, l := range g.lookups {
				ask(t, c, &n, fmt.Sprintf("%s lookup %d %s %v", g.test, i+1, l.domain, l.entries), l)
			}
			// Values ERL counts as one share one count: each answers one less remaining.
			for _, kv := range g.shared {
				first := uint32(0)
				for i := 0; i < len(kv); i += 2 {
					resp, err := c.ShouldRateLimit(context.Background(), request("test-domain", descriptor(kv[i], kv[i+1])))
					if err != nil {
						t.Fatal(err)
					}
					st := resp.Statuses[0]
					if i == 0 {
						first = st.GetLimitRemaining()
					}
					n.check(t, st.GetCurrentLimit().GetRequestsPerUnit() == 100 && st.GetLimitRemaining() == first-uint32(i/2),
						"%s shared %s=%s: %v, want 100 per minute and %d remaining (one count with %s=%s)", g.test, kv[i], kv[i+1], st, first-uint32(i/2), kv[0], kv[1])
				}
			}
			t.Logf("%s: %d of %d cases as ERL", g.test, n.cases-n.failed, n.cases)
			total.cases += n.cases
			total.failed += n.failed
		})
	}
	t.Logf("ERL config lookups: %d of %d cases as ERL", total.cases-total.failed, total.cases)
}

// TestUnknownDomain asks for domains no file defines, as ERL's integration test
// basic/foo_unknown_domain does: OK with no limit for each descriptor, counted by
// domain in tollgate_rls_unknown_domain_requests_total and logged once per domain.
func TestUnknownDomain(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false)
	for _, srv := range []*rls.Server{rls.New(eng, log), rls.NewDomains(map[string]rls.Domain{"rl": {Engine: eng}}, log)} {
		logs.Reset()
		reg := prometheus.NewRegistry()
		if err := srv.Register(reg); err != nil {
			t.Fatal(err)
		}
		c := serve(t, srv)
		for range 3 {
			for _, domain := range []string{"foo_unknown_domain", "elsewhere"} {
				resp, err := c.ShouldRateLimit(context.Background(), request(domain, descriptor("key1", "x"), descriptor("key2", "y")))
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.Statuses) != 2 || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].GetCode() != rlsv3.RateLimitResponse_OK {
					t.Fatalf("domain %s: %v, %v; want OK with no limit for each descriptor", domain, resp, err)
				}
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		counts := map[string]float64{}
		for _, mf := range mfs {
			if mf.GetName() != "tollgate_rls_unknown_domain_requests_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				counts[m.GetLabel()[0].GetValue()] = m.GetCounter().GetValue()
			}
		}
		if len(counts) != 2 || counts["foo_unknown_domain"] != 3 || counts["elsewhere"] != 3 {
			t.Errorf("tollgate_rls_unknown_domain_requests_total by domain = %v, want 3 for each unknown domain", counts)
		}
		if n := strings.Count(logs.String(), "domain no configuration defines"); n != 2 {
			t.Errorf("logged %d times, want once per domain:\n%s", n, logs.String())
		}
		// The known domain is decided, with its limit.
		resp, err := c.ShouldRateLimit(context.Background(), request("rl", descriptor("key1", "x")))
		if err != nil || resp.Statuses[0].CurrentLimit == nil {
			t.Errorf("domain rl: %v, %v; want its limit", resp, err)
		}
	}
}

// syncBuffer is a buffer for logs written while a test reads them.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (s *syncBuffer) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.b.Reset()
}

// TestSetDomains replaces a service's domains whole, as a reloaded directory does: a
// domain left out is unknown from the next request on (OK with no limit), a domain
// added is decided.
func TestSetDomains(t *testing.T) {
	t.Parallel()
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false)
	srv := rls.NewDomains(nil, slog.New(slog.DiscardHandler))
	c := serve(t, srv)
	limited := func(domain string) bool {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), request(domain, descriptor("key1", "x")))
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("domain %s: %v, %v; want OK", domain, resp, err)
		}
		return resp.Statuses[0].CurrentLimit != nil
	}
	if limited("rl") {
		t.Errorf("domain rl with no domains set: limited, want unknown")
	}
	srv.SetDomains(map[string]rls.Domain{"rl": {Engine: eng}})
	if !limited("rl") {
		t.Errorf("domain rl once set: no limit, want its limit")
	}
	srv.SetDomains(map[string]rls.Domain{})
	if limited("rl") {
		t.Errorf("domain rl once left out: limited, want unknown")
	}
}
