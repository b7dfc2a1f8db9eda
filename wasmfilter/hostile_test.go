package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-dev/tollgate/shared/bounds"
)

// nested returns a JSON value of arrays nested depth deep around a number.
func nested(depth int) string {
	return strings.Repeat("[", depth) + "1" + strings.Repeat("]", depth)
}

// nestedObject returns a JSON object nested depth deep under the key "a".
func nestedObject(depth int) string {
	return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
}

// TestHostileConfiguration starts the plugin with configurations nested deeper and
// larger than it reads: the VM must not trap, the plugin must refuse to start, and
// its critical log must name the field and the limit.
func TestHostileConfiguration(t *testing.T) {
	big := strings.Repeat("x", 4<<20)
	tests := []struct {
		name   string
		config string
		want   []string // in the critical log
	}{
		// attributes nested 64 deep in all (the object is the first level) parse, and
		// are refused for what they are.
		{"depth 64", `{"cluster": "c", "domain": "d", "attributes": ` + nested(63) + `}`, []string{"attributes[0]"}},
		{"depth 65", `{"cluster": "c", "domain": "d", "attributes": ` + nested(64) + `}`, []string{"attributes: is nested too deeply", "at most 64"}},
		{"depth 1000", `{"cluster": "c", "domain": "d", "local_limits": ` + nested(1000) + `}`, []string{"local_limits: is nested too deeply", "at most 64"}},
		{"depth 100000", `{"cluster": "c", "domain": "d", "deny_cache": ` + nested(100000) + `}`, []string{"deny_cache: is nested too deeply", "at most 64"}},
		{"object depth 10000", `{"cluster": "c", "domain": "d", "deny_cache": ` + nestedObject(10000) + `}`, []string{"deny_cache: is nested too deeply", "at most 64"}},
		{"object depth 100000 (600 KB)", `{"cluster": "c", "domain": "d", "deny_cache": ` + nestedObject(100000) + `}`, []string{"over the limit of " + strconv.Itoa(maxConfigBytes)}},
		{"depth 100000 unclosed", `{"cluster": "c", "domain": "d", "deny_cache": ` + strings.Repeat("[", 100000), []string{"deny_cache: is nested too deeply"}},
		{"256 KiB + 1", `{"cluster": "c", "domain": "` + strings.Repeat("d", maxConfigBytes-29) + `"}`, []string{strconv.Itoa(maxConfigBytes+1) + " bytes, over the limit of " + strconv.Itoa(maxConfigBytes)}},
		{"4 MiB string", `{"cluster": "c", "domain": "` + big + `"}`, []string{"over the limit of " + strconv.Itoa(maxConfigBytes)}},
		{"4 MiB of spaces", `{"cluster": "c", "domain": "d"` + strings.Repeat(" ", 4<<20) + `}`, []string{"over the limit of " + strconv.Itoa(maxConfigBytes)}},
		{"65 local limits", `{"cluster": "c", "domain": "d", "local_limits": [` + strings.Repeat(`{"name": "x", "rate": "1/s"},`, 64) + `{"name": "y", "rate": "1/s"}]}`, []string{"local_limits: 65 limits, over the limit of 64"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				host := newFilter(t, b, tc.config, time.Now)
				if st := host.StartPlugin(); st != types.OnPluginStartStatusFailed {
					t.Fatalf("StartPlugin(%d bytes) = %v, want Failed", len(tc.config), st)
				}
				logs := strings.Join(host.GetCriticalLogs(), "\n")
				for _, want := range tc.want {
					if !strings.Contains(logs, want) {
						t.Errorf("critical log %.300q does not say %q", logs, want)
					}
				}
			})
		})
	}
}

// hostileAnswers are callout answers no decision service sends: deep, large, or
// with headers out of range. The filter must answer each cleanly.
func hostileAnswers() []struct {
	name    string
	headers [][2]string
	body    string
} {
	type answer = struct {
		name    string
		headers [][2]string
		body    string
	}
	var out []answer
	for _, status := range []string{"200", "429", "503"} {
		for _, depth := range []int{64, 65, 1000, 100000} {
			out = append(out,
				answer{status + " array depth " + strconv.Itoa(depth), [][2]string{{":status", status}}, `{"reason":"unavailable","x":` + nested(depth-1) + `}`},
				answer{status + " object depth " + strconv.Itoa(depth), [][2]string{{":status", status}}, nestedObject(depth)},
			)
		}
		for _, size := range []int{maxCalloutBody, maxCalloutBody + 1, 1 << 20, 4 << 20} {
			body := `{"reason":"unavailable","retry_after_ms":5000,"pad":"` + strings.Repeat("p", size) + `"}`
			out = append(out, answer{status + " body " + strconv.Itoa(len(body)) + " bytes", [][2]string{{":status", status}}, body[:min(len(body), size)]})
		}
		out = append(out,
			answer{status + " huge numbers", [][2]string{{":status", status}, {"retry-after", "99999999999999999999999"}, {"x-tollgate-delay-ms", "99999999999999999999"}, {"ratelimit", `"a";r=0;t=99999999999999999999`}},
				`{"reason":"unavailable","retry_after_ms":1e308,"delay_ms":-5,"reset_after_ms":99999999999999999999}`},
			answer{status + " negative delay", [][2]string{{":status", status}, {"x-tollgate-delay-ms", "-1"}, {"retry-after", "-7"}}, `{"delay_ms":-1}`},
			answer{status + " 1 MiB header", [][2]string{{":status", status}, {"ratelimit", strings.Repeat("r", 1<<20)}, {"retry-after", strings.Repeat("9", 1<<16)}}, ""},
			answer{status + " invalid UTF-8", [][2]string{{":status", status}, {"ratelimit-policy", "\xff\xfe"}}, "{\"rule\":\"\xff\"}"},
		)
	}
	many := [][2]string{{":status", "429"}}
	for i := range 10000 {
		many = append(many, [2]string{"x-h" + strconv.Itoa(i), "v"})
	}
	return append(out, answer{"429 with 10000 headers", many, denyBody})
}

// cleanAnswer reports what is wrong with the filter's handling of a callout answer,
// or "": the request must be let through (at once, or held for a shaping delay and
// released by the tick once the longest delay has passed), or answered locally with
// a 429 or 503 and a JSON body; it may not be both.
func cleanAnswer(host filterHost, clock *fakeClock, id uint32) string {
	lr := host.GetSentLocalResponse(id)
	action := host.GetCurrentHttpStreamAction(id)
	if lr == nil && action == types.ActionPause && host.GetTickPeriod() > 0 {
		clock.Advance(defaultMaxDelay + time.Millisecond)
		host.Tick()
		action = host.GetCurrentHttpStreamAction(id)
	}
	switch {
	case lr == nil && action != types.ActionContinue:
		return "the request was neither let through nor answered (action " + strconv.Itoa(int(action)) + ")"
	case lr == nil:
		return ""
	case lr.StatusCode != 429 && lr.StatusCode != 503:
		return "a local " + strconv.Itoa(int(lr.StatusCode)) + ", want 429 or 503"
	case !json.Valid(lr.Data):
		return "a local reply whose body is not JSON: " + string(lr.Data[:min(len(lr.Data), 200)])
	case action == types.ActionContinue:
		return "a local reply and a request let through"
	}
	return ""
}

// TestHostileCalloutAnswers answers callouts with bodies nested and sized past what
// the filter reads, and with headers out of range.
func TestHostileCalloutAnswers(t *testing.T) {
	for _, a := range hostileAnswers() {
		t.Run(a.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				host, clock := startFilter(t, b, cfg(""))
				id, _ := request(host, "k1", "/search")
				answer(t, host, id, a.headers, a.body)
				if msg := cleanAnswer(host, clock, id); msg != "" {
					t.Fatal(msg)
				}
				host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
				host.CompleteHttpContext(id)
				// The VM still works.
				id, _ = request(host, "k2", "/search")
				answer(t, host, id, allowHeaders(), allowBody)
				if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
					t.Errorf("the next request after the hostile answer: action %v, want Continue", got)
				}
			})
		})
	}
}

// outcome is what the filter did with a request, to compare the backends.
type outcome struct {
	action types.Action
	status uint32 // of the local response; 0 without one
}

// FuzzPluginConfig starts the compiled plugin and the native one with any
// configuration: the VM must not trap, and both must agree on whether it is valid.
func FuzzPluginConfig(f *testing.F) {
	for _, tc := range invalidConfigs {
		f.Add([]byte(tc.config))
	}
	f.Add([]byte(cfg("")))
	f.Add([]byte(socketsConfig))
	f.Add([]byte(`{"cluster": "c", "domain": "d", "attributes": ` + nested(63) + `}`))
	f.Add([]byte(`{"cluster": "c", "domain": "d", "local_limits": ` + nested(1000) + `}`))
	filterRuntime(f) // built before the first input: see FuzzSettleAnswer
	f.Fuzz(func(t *testing.T, config []byte) {
		var got [2]bool
		for i, b := range backends {
			host := newFilter(t, b, string(config), time.Now)
			got[i] = host.StartPlugin() == types.OnPluginStartStatusOK
			if !got[i] && len(host.GetCriticalLogs()) == 0 {
				t.Errorf("%s: the plugin refused %q without a critical log", b, config)
			}
		}
		if got[0] != got[1] {
			t.Errorf("StartPlugin(%q): native started %v, wasm started %v; want the same", config, got[0], got[1])
		}
	})
}

// parseHeaders reads "name: value" lines; a line without ": " is a name with an
// empty value.
func parseHeaders(s string) [][2]string {
	var hs [][2]string
	for line := range strings.SplitSeq(s, "\n") {
		if line == "" {
			continue
		}
		name, value, _ := strings.Cut(line, ": ")
		hs = append(hs, [2]string{name, value})
	}
	return hs
}

// FuzzCalloutAnswer answers a request's callout with any status, headers and body on
// the compiled filter and the native one: the VM must not trap, the answer must be
// clean (cleanAnswer), and both backends must do the same.
func FuzzCalloutAnswer(f *testing.F) {
	header := func(hs [][2]string) string {
		var b strings.Builder
		for _, h := range hs[1:] {
			b.WriteString(h[0] + ": " + h[1] + "\n")
		}
		return b.String()
	}
	for _, a := range hostileAnswers() {
		if len(a.body) <= 4096 && len(a.headers) < 10 && len(header(a.headers)) < 4096 {
			f.Add(a.headers[0][1], header(a.headers), []byte(a.body))
		}
	}
	f.Add("200", header(allowHeaders()), []byte(allowBody))
	f.Add("429", header(denyHeaders()), []byte(denyBody))
	f.Add("503", "retry-after: 1\n", []byte(unavailableBody))
	f.Add("200", "x-tollgate-delay-ms: 250\n", []byte(allowBody))
	f.Add("200", "x-tollgate-delay-ms: 250\n", []byte(strings.Replace(allowBody, `"delay_ms":0`, `"delay_ms":250`, 1)))
	f.Add("", "", []byte(nil))
	config := cfg(`"failure_mode": "local", "local_limits": [{"name": "l", "key": ["api_key"], "algorithm": "gcra", "rate": "1/min"}]`)
	filterRuntime(f) // built before the first input: see FuzzSettleAnswer
	f.Fuzz(func(t *testing.T, status, headers string, body []byte) {
		hs := parseHeaders(headers)
		if status != "" {
			hs = append([][2]string{{":status", status}}, hs...)
		}
		var got [2]outcome
		for i, b := range backends {
			host, clock := startFilter(t, b, config)
			id, _ := request(host, "k1", "/search")
			answer(t, host, id, hs, string(body))
			if msg := cleanAnswer(host, clock, id); msg != "" {
				t.Fatalf("%s: status %q, headers %q, body %q: %s", b, status, headers, body, msg)
			}
			got[i] = outcome{action: host.GetCurrentHttpStreamAction(id)}
			if lr := host.GetSentLocalResponse(id); lr != nil {
				got[i].status = lr.StatusCode
			}
			host.CompleteHttpContext(id)
		}
		if got[0] != got[1] {
			t.Errorf("status %q, headers %q, body %q: native %+v, wasm %+v; want the same", status, headers, body, got[0], got[1])
		}
	})
}

// TestGarbageCollectionWithoutPoll runs enough requests through one VM for Go's
// garbage collector to run many times, on a host whose WASI poll_oneoff fails with
// ENOSYS as Envoy's did before proxy-wasm-cpp-host PR #533: a Go runtime that polled
// from its scheduler would trap (golang/go#78513).
func TestGarbageCollectionWithoutPoll(t *testing.T) {
	host, _ := startFilter(t, wasm, cfg(`"deny_cache": {"enabled": false}`))
	pad := strings.Repeat("p", 32<<10)
	key := strings.Repeat("k", 200)
	for i := range 400 {
		id, _ := request(host, key+strconv.Itoa(i), "/search")
		status := [][2]string{{":status", "200"}}
		if i%2 == 1 {
			status = [][2]string{{":status", "429"}, {"retry-after", "1"}}
		}
		answer(t, host, id, status, `{"rule":"per-key","pad":"`+pad+`"}`)
		host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
		host.CompleteHttpContext(id)
	}
	wantCounters(t, host, map[string]uint64{"allowed": 200, "denied": 200})
}

// TestHostileRequests sends requests with headers far past what Envoy would pass on
// (its defaults are 60 KiB and 100 headers): the filter must ask the service with its
// bounded attributes, or answer 400 when it is set to reject oversize values.
func TestHostileRequests(t *testing.T) {
	many := [][2]string{{":method", "GET"}, {":path", "/search"}}
	for i := range 10000 {
		many = append(many, [2]string{"x-api-key", "k" + strconv.Itoa(i)})
	}
	tests := []struct {
		name     string
		oversize string
		headers  [][2]string
		want     uint32 // the local reply's status; 0: a callout
	}{
		{"1 MiB key, truncated", "truncate", [][2]string{{":method", "GET"}, {":path", "/search"}, {"x-api-key", strings.Repeat("k", 1<<20)}}, 0},
		{"1 MiB key, rejected", "reject", [][2]string{{":method", "GET"}, {":path", "/search"}, {"x-api-key", strings.Repeat("k", 1<<20)}}, 400},
		{"4 MiB path", "truncate", [][2]string{{":method", "GET"}, {":path", "/" + strings.Repeat("a", 4<<20) + "?q"}}, 0},
		{"10000 keys", "truncate", many, 0},
		{"invalid UTF-8 and NULs", "truncate", [][2]string{{":method", "\xff\x00"}, {":path", "\x00\xfe/"}, {"x-api-key", "\xc3"}}, 0},
		{"no pseudo headers", "truncate", nil, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			forBackends(t, func(t *testing.T, b backend) {
				host, _ := startFilter(t, b, cfg(`"oversize": "`+tc.oversize+`"`))
				id := host.InitializeHttpContext()
				host.CallOnRequestHeaders(id, tc.headers, true)
				lr := host.GetSentLocalResponse(id)
				switch {
				case tc.want == 0 && lr != nil:
					t.Fatalf("local %d reply, want a callout", lr.StatusCode)
				case tc.want == 0:
					c := onlyCallout(t, host, id)
					if len(c.Body) > bounds.MaxBody || !json.Valid(c.Body) {
						t.Fatalf("callout body of %d bytes (valid JSON: %v), want valid JSON of at most %d", len(c.Body), json.Valid(c.Body), bounds.MaxBody)
					}
				case lr == nil || lr.StatusCode != tc.want:
					t.Fatalf("local reply %+v, want %d", lr, tc.want)
				}
				host.CompleteHttpContext(id)
			})
		})
	}
}
