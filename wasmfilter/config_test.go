package main

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
)

// invalidConfigs are rejected by parseConfig; field is the path the error must name.
var invalidConfigs = []struct {
	field  string
	config string
}{
	{"empty", ``},
	{"valid JSON", `{"cluster": `},
	{"valid JSON", "{\"cluster\": \"c\xff\", \"domain\": \"d\"}"},
	{"nested too deeply", `{"cluster": "c", "domain": "d", "x": ` + strings.Repeat("[", 65) + strings.Repeat("]", 65) + `}`},
	{"cluster: is set twice", `{"cluster": "c", "domain": "d", "cluster": "e"}`},
	{"attributes[0].name: is set twice", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "method", "name": "j"}]}`},
	{"JSON object", `["cluster"]`},
	{"cluster", `{"domain": "d"}`},
	{"cluster", `{"cluster": 7, "domain": "d"}`},
	{"domain", `{"cluster": "c"}`},
	{"domain", `{"cluster": "c", "domain": ""}`},
	{"clustr", `{"clustr": "c", "cluster": "c", "domain": "d"}`},
	{"path", `{"cluster": "c", "domain": "d", "path": "v1/check"}`},
	{"timeout_ms", `{"cluster": "c", "domain": "d", "timeout_ms": 0}`},
	{"timeout_ms", `{"cluster": "c", "domain": "d", "timeout_ms": "100ms"}`},
	{"timeout_ms", `{"cluster": "c", "domain": "d", "timeout_ms": 1.5}`},
	{"cost", `{"cluster": "c", "domain": "d", "cost": -1}`},
	{"attributes", `{"cluster": "c", "domain": "d", "attributes": {"api_key": "x-api-key"}}`},
	{"attributes", `{"cluster": "c", "domain": "d", "attributes": []}`},
	{"attributes[0].name", `{"cluster": "c", "domain": "d", "attributes": [{"from": "method"}]}`},
	{"attributes[0].name", `{"cluster": "c", "domain": "d", "attributes": [{"name": "Api Key", "from": "method"}]}`},
	{"attributes[1].name", `{"cluster": "c", "domain": "d", "attributes": [{"name": "m", "from": "method"}, {"name": "m", "from": "path"}]}`},
	{"attributes[0].from", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "cookie"}]}`},
	{"attributes[0].header", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "header"}]}`},
	{"attributes[0].header", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "method", "header": "x"}]}`},
	{"attributes[0].header", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "header", "header": ":path"}]}`},
	{"attributes[0].value", `{"cluster": "c", "domain": "d", "attributes": [{"name": "k", "from": "method", "value": "x"}]}`},
	{"max_attribute_bytes", `{"cluster": "c", "domain": "d", "max_attribute_bytes": 0}`},
	{"max_attribute_bytes", `{"cluster": "c", "domain": "d", "max_attribute_bytes": 1025}`},
	{"oversize", `{"cluster": "c", "domain": "d", "oversize": "drop"}`},
	{"failure_mode", `{"cluster": "c", "domain": "d", "failure_mode": "fail-open"}`},
	{"local_limits", `{"cluster": "c", "domain": "d", "failure_mode": "local"}`},
	{"local_limits", `{"cluster": "c", "domain": "d", "local_limits": {"name": "x"}}`},
	{"local_limits[0].rate", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x", "rate": "5 per minute"}]}`},
	{"local_limits[0].rate", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x"}]}`},
	{"local_limits[0].algorithm", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x", "rate": "5/min", "algorithm": "lossy"}]}`},
	{"local_limits[0].burst", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x", "rate": "5/min", "algorithm": "fixed_window", "burst": 3}]}`},
	{"local_limits[0].key[0]", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x", "rate": "5/min", "key": ["user"]}]}`},
	{"local_limits[1].name", `{"cluster": "c", "domain": "d", "local_limits": [{"name": "x", "rate": "5/min"}, {"name": "x", "rate": "5/s"}]}`},
	{"deny_cache", `{"cluster": "c", "domain": "d", "deny_cache": true}`},
	{"deny_cache.enabled", `{"cluster": "c", "domain": "d", "deny_cache": {"enabled": "yes"}}`},
	{"deny_cache.max_entries", `{"cluster": "c", "domain": "d", "deny_cache": {"max_entries": 0}}`},
	{"deny_cache.key", `{"cluster": "c", "domain": "d", "deny_cache": {"key": []}}`},
	{"deny_cache.key[0]", `{"cluster": "c", "domain": "d", "deny_cache": {"key": ["api_key"]}}`},
	{"deny_cache.ttl", `{"cluster": "c", "domain": "d", "deny_cache": {"ttl": 5}}`},
	{"max_delay_ms", `{"cluster": "c", "domain": "d", "max_delay_ms": -1}`},
	{"tick_ms", `{"cluster": "c", "domain": "d", "tick_ms": 5000}`},
	{"max_held_requests", `{"cluster": "c", "domain": "d", "max_held_requests": 1000001}`},
	{"settle", `{"cluster": "c", "domain": "d", "settle": "x-tokens-used"}`},
	{"settle.cost_header", `{"cluster": "c", "domain": "d", "settle": {}}`},
	{"settle.cost_header", `{"cluster": "c", "domain": "d", "settle": {"cost_header": ""}}`},
	{"settle.cost_header", `{"cluster": "c", "domain": "d", "settle": {"cost_header": ":status"}}`},
	{"settle.cost_header", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x tokens"}}`},
	{"settle.cost_header", `{"cluster": "c", "domain": "d", "settle": {"cost_header": 7}}`},
	{"settle.cost_trailer", `{"cluster": "c", "domain": "d", "settle": {"cost_trailer": "x-usage\n"}}`},
	{"settle.cost_headers", `{"cluster": "c", "domain": "d", "settle": {"cost_headers": "x-tokens-used"}}`},
	{"settle.cost_header: is set twice", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "a", "cost_header": "b"}}`},
	{"settle.estimate", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "estimate": 0}}`},
	{"settle.estimate", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "estimate": 1048577}}`},
	{"settle.estimate", `{"cluster": "c", "domain": "d", "cost": 1, "settle": {"cost_header": "x", "estimate": 500}}`},
	{"settle.reserve_ttl_ms", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "reserve_ttl_ms": 1000}}`},
	{"settle.reserve_ttl_ms", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "estimate": 5, "reserve_ttl_ms": 3600001}}`},
	{"settle.max_attempts", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "max_attempts": 0}}`},
	{"settle.max_attempts", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "max_attempts": 11}}`},
	{"settle.retry_ms", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "retry_ms": 0}}`},
	{"settle.retry_ms", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "retry_ms": "200ms"}}`},
	{"settle.max_pending", `{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "max_pending": 0}}`},
}

// TestParseSettle reads the settle block: its defaults, every field, and errors that
// say the fix.
func TestParseSettle(t *testing.T) {
	t.Parallel()
	c, err := parseConfig([]byte(`{"cluster": "c", "domain": "d", "settle": {"cost_header": "X-Tokens-Used"}}`))
	if err != nil {
		t.Fatalf("parseConfig(settle) error: %v", err)
	}
	want := &settleConfig{costHeader: "x-tokens-used", maxAttempts: 3, retry: 200 * time.Millisecond, maxPending: 10000}
	if !reflect.DeepEqual(c.settle, want) || c.cost != 1 {
		t.Errorf("parseConfig(settle) = %+v, cost %d; want %+v, cost 1", c.settle, c.cost, want)
	}
	c, err = parseConfig([]byte(`{"cluster": "c", "domain": "d", "settle": {"cost_trailer": "x-usage", "estimate": 500,
		"reserve_ttl_ms": 60000, "max_attempts": 5, "retry_ms": 50, "max_pending": 7}}`))
	if err != nil {
		t.Fatalf("parseConfig(settle, full) error: %v", err)
	}
	want = &settleConfig{costTrailer: "x-usage", estimate: 500, reserveTTL: time.Minute, maxAttempts: 5, retry: 50 * time.Millisecond, maxPending: 7}
	if !reflect.DeepEqual(c.settle, want) {
		t.Errorf("parseConfig(settle, full) = %+v, want %+v", c.settle, want)
	}
	if c, _ := parseConfig([]byte(`{"cluster": "c", "domain": "d"}`)); c.settle != nil {
		t.Errorf("parseConfig(no settle).settle = %+v, want nil", c.settle)
	}
	for config, msg := range map[string]string{
		`{"cluster": "c", "domain": "d", "settle": {}}`:                                             `invalid plugin configuration: settle.cost_header: settle needs the cost's response header or trailer: set cost_header (e.g. "x-tokens-used") or cost_trailer, or both`,
		`{"cluster": "c", "domain": "d", "cost": 0, "settle": {"cost_header": "x", "estimate": 9}}`: `invalid plugin configuration: settle.estimate: is the request's cost when it reserves, so it replaces cost: remove cost, or remove estimate to check with cost and settle the whole response`,
		`{"cluster": "c", "domain": "d", "settle": {"cost_header": ":status"}}`:                     `invalid plugin configuration: settle.cost_header: ":status" is not a header name; name the response's own, e.g. "x-tokens-used"`,
		`{"cluster": "c", "domain": "d", "settle": {"cost_header": "x", "max_attempts": 11}}`:       `invalid plugin configuration: settle.max_attempts: must be from 1 to 10`,
	} {
		if _, err := parseConfig([]byte(config)); err == nil || err.Error() != msg {
			t.Errorf("parseConfig(%s) error %v, want %s", config, err, msg)
		}
	}
}

func TestParseConfigRejects(t *testing.T) {
	t.Parallel()
	for _, tc := range invalidConfigs {
		c, err := parseConfig([]byte(tc.config))
		var ce *configError
		if !errors.As(err, &ce) {
			t.Errorf("parseConfig(%s) = %v, %v; want a *configError", tc.config, c, err)
			continue
		}
		if !strings.Contains(err.Error(), tc.field) {
			t.Errorf("parseConfig(%s) error %q does not name %q", tc.config, err, tc.field)
		}
	}
}

func TestParseConfigDefaults(t *testing.T) {
	t.Parallel()
	c, err := parseConfig([]byte(`{"cluster": "tollgate_decision", "domain": "public-api"}`))
	if err != nil {
		t.Fatalf("parseConfig(minimal) error: %v", err)
	}
	want := &config{
		cluster:           "tollgate_decision",
		authority:         "tollgate_decision",
		path:              "/v1/check",
		timeout:           100 * time.Millisecond,
		domain:            "public-api",
		cost:              1,
		attributes:        defaultAttributes,
		maxAttributeBytes: 256,
		oversize:          oversizeTruncate,
		failureMode:       failOpen,
		localMaxKeys:      10000,
		denyCache:         true,
		denyCacheEntries:  10000,
		maxDelay:          10 * time.Second,
		tick:              10 * time.Millisecond,
		maxHeld:           1000,
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("parseConfig(minimal) = %+v, want %+v", c, want)
	}
}

func TestParseConfigFull(t *testing.T) {
	t.Parallel()
	c, err := parseConfig([]byte(`{
		"cluster": "tollgate_decision", "authority": "limiter.internal", "path": "/check",
		"timeout_ms": 40, "domain": "public-api", "cost": 2,
		"attributes": [{"name": "api_key", "from": "header", "header": "X-Api-Key"}, {"name": "method", "from": "method"}],
		"max_attribute_bytes": 128, "oversize": "reject",
		"failure_mode": "local",
		"local_limits": [{"name": "local", "key": ["api_key"], "algorithm": "token_bucket", "rate": "10/s", "burst": 20}],
		"local_max_keys": 500,
		"deny_cache": {"enabled": false, "max_entries": 5, "key": ["api_key"]},
		"max_delay_ms": 0, "tick_ms": 25, "max_held_requests": 0
	}`))
	if err != nil {
		t.Fatalf("parseConfig(full) error: %v", err)
	}
	if c.authority != "limiter.internal" || c.path != "/check" || c.timeout != 40*time.Millisecond || c.cost != 2 {
		t.Errorf("parseConfig(full) callout fields = %q %q %v %d", c.authority, c.path, c.timeout, c.cost)
	}
	if c.attributes[0].header != "x-api-key" {
		t.Errorf("header name = %q, want it lower-cased", c.attributes[0].header)
	}
	wantLimit := algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Second, Burst: 20}
	if len(c.localLimits) != 1 || c.localLimits[0].meter.Limits[0] != wantLimit || !reflect.DeepEqual(c.localLimits[0].key, []string{"api_key"}) {
		t.Errorf("local limits = %+v, want one %v keyed by api_key", c.localLimits, wantLimit)
	}
	if c.denyCache || c.denyCacheEntries != 5 || c.maxDelay != 0 || c.tick != 25*time.Millisecond || c.maxHeld != 0 || c.oversize != oversizeReject {
		t.Errorf("parseConfig(full) = %+v", c)
	}
}

// FuzzParseConfig checks that no configuration crashes the parser (a panic traps the
// VM, and nothing recovers it) and that every accepted one is usable. FuzzPluginConfig
// feeds the same inputs to the compiled module.
func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(`{"cluster": "c", "domain": "d"}`))
	for _, tc := range invalidConfigs {
		f.Add([]byte(tc.config))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parseConfig(data)
		if err != nil {
			if c != nil {
				t.Fatalf("parseConfig returned a config and the error %v", err)
			}
			return
		}
		if c.cluster == "" || c.domain == "" || len(c.attributes) == 0 || c.timeout <= 0 || c.tick <= 0 {
			t.Fatalf("parseConfig accepted an unusable config %+v", c)
		}
		if c.failureMode == failLocal && len(c.localLimits) == 0 {
			t.Fatalf("failure mode local without local limits accepted")
		}
		for _, l := range c.localLimits {
			if err := l.meter.Validate(); err != nil {
				t.Fatalf("accepted an invalid local limit: %v", err)
			}
		}
		if s := c.settle; s != nil {
			if s.costHeader == "" && s.costTrailer == "" || s.maxAttempts < 1 || s.retry <= 0 || s.maxPending < 1 ||
				s.estimate < 0 || s.estimate > bounds.MaxCost || s.reserveTTL > 0 && s.estimate == 0 {
				t.Fatalf("parseConfig accepted an unusable settle block %+v", s)
			}
		}
	})
}

// TestBoundsMatchTheService checks that the filter refuses a configuration past the
// decision service's bounds (package bounds, which both use): past them the service
// answers 400 and every request would take the failure mode.
func TestBoundsMatchTheService(t *testing.T) {
	t.Parallel()
	attrs := make([]string, bounds.MaxAttributes+1)
	for i := range attrs {
		attrs[i] = fmt.Sprintf(`{"name": "h%d", "from": "header", "header": "x-h%d"}`, i, i)
	}
	_, err := parseConfig([]byte(`{"cluster": "c", "domain": "d", "attributes": [` + strings.Join(attrs, ",") + `]}`))
	if err == nil || !strings.Contains(err.Error(), "attributes") {
		t.Errorf("%d attributes: parseConfig error %v, want one naming attributes", len(attrs), err)
	}
	if _, err := parseConfig([]byte(`{"cluster": "c", "domain": "d", "attributes": [` + strings.Join(attrs[:bounds.MaxAttributes], ",") + `]}`)); err != nil {
		t.Errorf("%d attributes: parseConfig = %v, want accepted", bounds.MaxAttributes, err)
	}
	if _, err := parseConfig(fmt.Appendf(nil, `{"cluster": "c", "domain": "d", "cost": %d}`, bounds.MaxCost+1)); err == nil || !strings.Contains(err.Error(), "cost") {
		t.Errorf("cost %d: parseConfig error %v, want one naming cost", bounds.MaxCost+1, err)
	}
	if _, err := parseConfig(fmt.Appendf(nil, `{"cluster": "c", "domain": "d", "cost": %d}`, bounds.MaxCost)); err != nil {
		t.Errorf("cost %d: parseConfig = %v, want accepted", bounds.MaxCost, err)
	}
}
