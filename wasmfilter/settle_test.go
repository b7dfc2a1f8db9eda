//go:build !wasip1

package main

import (
	"encoding/json"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// tokensPolicy is an AI gateway's tokens-per-minute limit per API key. The window is
// an hour so that no test crosses it.
const tokensPolicy = `
domain: public-api
failure: {mode: open, timeout: 2s}
rules:
  - name: tokens
    match: {api_key: "*"}
    limits:
      - {algorithm: fixed_window, rate: 1000/h}
`

// TestSettleBoundsMatchTheService: the settle block's reserve_ttl_ms is bounded as
// the decision service bounds it (the filter cannot import the engine).
func TestSettleBoundsMatchTheService(t *testing.T) {
	if maxReserveTTL != engine.MaxReservationTTL {
		t.Errorf("maxReserveTTL = %v, want the service's %v", maxReserveTTL, engine.MaxReservationTTL)
	}
	if engine.DefaultReservationTTL != 300*time.Second {
		t.Errorf("the service's default reservation TTL is %v; wasmfilter/README.md says 300000 ms", engine.DefaultReservationTTL)
	}
}

// sentCheck is a POST /v1/check body as the filter sent it.
type sentCheck struct {
	Domain       string            `json:"domain"`
	Attributes   map[string]string `json:"attributes"`
	Cost         *int64            `json:"cost"`
	Settle       bool              `json:"settle"`
	ReserveID    string            `json:"reserve_id"`
	ReserveTTLMs int64             `json:"reserve_ttl_ms"`
}

func decodeCheck(t *testing.T, body []byte) sentCheck {
	t.Helper()
	var c sentCheck
	if err := json.Unmarshal(body, &c); err != nil || c.Cost == nil {
		t.Fatalf("callout body %s: %v (or no cost); want a /v1/check body", body, err)
	}
	return c
}

// settleRig drives the plugin's settlements: the callouts the plugin dispatches
// from its own context, answered in order.
type settleRig struct {
	t     *testing.T
	host  filterHost
	clock *fakeClock
	envoy *envoyCallouts // nil without a decision service
	seen  int            // plugin callouts answered or looked at so far
}

// next returns the plugin's callouts dispatched since the last call.
func (r *settleRig) next() []proxytest.HttpCalloutAttribute {
	all := r.host.GetCalloutAttributesFromContext(proxytest.PluginContextID)
	out := all[r.seen:]
	r.seen = len(all)
	return out
}

// tickOne ticks and returns the one settlement the tick sent.
func (r *settleRig) tickOne() proxytest.HttpCalloutAttribute {
	r.t.Helper()
	r.host.Tick()
	cs := r.next()
	if len(cs) != 1 {
		r.t.Fatalf("the tick sent %d settlement callouts, want 1", len(cs))
	}
	return cs[0]
}

// forward sends a plugin callout to the decision service and hands its answer back.
func (r *settleRig) forward(c proxytest.HttpCalloutAttribute) (headers [][2]string, body []byte) {
	r.t.Helper()
	headers, body = wasmhost.Forward(http.DefaultClient, r.envoy.url, wasmhost.Callout{Headers: c.Headers, Body: c.Body, Timeout: r.envoy.timeout})
	r.host.CallOnHttpCallResponse(c.CalloutID, headers, nil, body)
	return headers, body
}

// respond answers a request admitted upstream with the response headers (and
// trailers, when not nil), and ends its stream.
func respond(host filterHost, id uint32, headers, trailers [][2]string) {
	host.CallOnResponseHeaders(id, append([][2]string{{":status", "200"}}, headers...), trailers == nil)
	if trailers != nil {
		host.CallOnResponseTrailers(id, trailers)
	}
	host.CompleteHttpContext(id)
}

// admitted sends a request, forwards its check to the decision service and
// requires a 200; it returns the stream and the check the filter sent.
func (r *settleRig) admitted(apiKey string) (uint32, sentCheck) {
	r.t.Helper()
	id, _ := request(r.host, apiKey, "/v1/chat")
	if !r.envoy.forward(id) {
		r.t.Fatal("the request made no check callout")
	}
	if st := get(r.envoy.last, ":status"); st != "200" {
		r.t.Fatalf("the service answered the check %s %s, want 200", st, r.envoy.lastBody)
	}
	cs := callouts(r.host, id)
	return id, decodeCheck(r.t, cs[len(cs)-1].Body)
}

func settleCounters(t *testing.T, host filterHost, want map[string]uint64) {
	t.Helper()
	for _, name := range []string{"settled", "settled_units", "settle_retries", "settle_failures", "settle_no_cost"} {
		if got := counter(t, host, "tollgate."+name); got != want[name] {
			t.Errorf("counter tollgate.%s = %d, want %d", name, got, want[name])
		}
	}
}

// TestSettleCostHeader reads each response's cost from its header and settles it
// with the real decision service on a real Redis, after the stream: the overshoot of
// a 1000-token limit is charged (a debt), and the next request is denied.
func TestSettleCostHeader(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, tokensPolicy)
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used"}`))
		r := &settleRig{t: t, host: host, clock: clock, envoy: &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}}

		for i, tokens := range []int64{900, 200} {
			id, check := r.admitted("k1")
			if *check.Cost != 1 || check.Settle || check.ReserveID != "" {
				t.Errorf("request %d: check %+v, want a plain check of cost 1", i+1, check)
			}
			respond(host, id, [][2]string{{"x-tokens-used", strconv.FormatInt(tokens, 10)}}, nil)
			if cs := r.next(); len(cs) != 0 {
				t.Fatalf("request %d: %d settlement callouts before the tick, want none (they go from the plugin's tick)", i+1, len(cs))
			}
			if host.GetTickPeriod() == 0 {
				t.Fatalf("request %d: no tick after the stream ended with a settlement queued", i+1)
			}
			c := r.tickOne()
			s := decodeCheck(t, c.Body)
			want := sentCheck{Domain: "public-api", Attributes: check.Attributes, Cost: &tokens, Settle: true}
			if !reflect.DeepEqual(s, want) {
				t.Errorf("request %d: settlement %s, want settle true, cost %d and the check's attributes %v", i+1, c.Body, tokens, check.Attributes)
			}
			if c.Upstream != "tollgate_decision" || get(c.Headers, ":path") != "/v1/check" || get(c.Headers, ":method") != "POST" {
				t.Errorf("request %d: settlement callout to %s %s %s", i+1, c.Upstream, get(c.Headers, ":method"), get(c.Headers, ":path"))
			}
			hs, body := r.forward(c)
			if get(hs, ":status") != "200" {
				t.Fatalf("request %d: the service answered the settlement %s %s, want 200", i+1, get(hs, ":status"), body)
			}
			if i == 1 && get(hs, "x-ratelimit-remaining") != "0" {
				t.Errorf("the 200-token overshoot: X-RateLimit-Remaining %q, want 0 (in debt)", get(hs, "x-ratelimit-remaining"))
			}
		}
		host.Tick()
		if p := host.GetTickPeriod(); p != 0 {
			t.Errorf("tick period %d ms with nothing held or queued, want 0", p)
		}
		// 1 + 900 + 1 + 200 = 1102 of 1000: the next check is denied.
		id, _ := request(host, "k1", "/v1/chat")
		r.envoy.forward(id)
		if lr := host.GetSentLocalResponse(id); lr == nil || lr.StatusCode != 429 {
			t.Fatalf("after the overshoot: local response %+v, want 429 (the debt was charged)", lr)
		}
		settleCounters(t, host, map[string]uint64{"settled": 2, "settled_units": 1100})
		// A denied request went nowhere: nothing to settle, and nothing is missing.
		host.CompleteHttpContext(id)
		host.Tick()
		if cs := r.next(); len(cs) != 0 {
			t.Errorf("a denied request sent %d settlements, want none", len(cs))
		}
		settleCounters(t, host, map[string]uint64{"settled": 2, "settled_units": 1100})
	})
}

// TestSettleCostTrailer reads the cost from a response trailer (a gRPC or streamed
// answer's usage comes last); with a header configured too, the trailer wins.
func TestSettleCostTrailer(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "cost_trailer": "x-usage-total"}`))
		r := &settleRig{t: t, host: host, clock: clock}
		for _, tc := range []struct {
			headers, trailers [][2]string
			want              int64
		}{
			{nil, [][2]string{{"x-usage-total", "42"}}, 42},
			{[][2]string{{"x-tokens-used", "10"}}, [][2]string{{"x-usage-total", "77"}}, 77},
			{[][2]string{{"x-tokens-used", "10"}}, [][2]string{{"grpc-status", "0"}}, 10},
		} {
			id, _ := request(host, "k1", "/v1/chat")
			answer(t, host, id, [][2]string{{":status", "200"}}, `{"allowed":true}`)
			respond(host, id, tc.headers, tc.trailers)
			c := r.tickOne()
			if s := decodeCheck(t, c.Body); *s.Cost != tc.want || !s.Settle || s.Attributes["api_key"] != "k1" {
				t.Errorf("headers %v, trailers %v: settlement %s, want settle true, cost %d, api_key k1", tc.headers, tc.trailers, c.Body, tc.want)
			}
			host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "200"}}, nil, []byte(`{"allowed":true}`))
		}
		settleCounters(t, host, map[string]uint64{"settled": 3, "settled_units": 42 + 77 + 10})
	})
}

// TestSettleServiceUnreachable stops the decision service between the check and the
// settlement: every attempt fails (Envoy's 503, or no answer at all), is sent again
// after retry_ms from the tick up to max_attempts, and is then counted and logged,
// never dropped silently. The filter does not trap.
func TestSettleServiceUnreachable(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, tokensPolicy)
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "max_attempts": 3, "retry_ms": 200}`))
		r := &settleRig{t: t, host: host, clock: clock, envoy: &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}}
		id, _ := r.admitted("k1")
		srv.Close()
		respond(host, id, [][2]string{{"x-tokens-used", "300"}}, nil)

		for attempt := 1; attempt <= 3; attempt++ {
			c := r.tickOne()
			if s := decodeCheck(t, c.Body); *s.Cost != 300 || !s.Settle {
				t.Fatalf("attempt %d: settlement %s, want cost 300, settle true", attempt, c.Body)
			}
			if attempt == 2 {
				host.CallOnHttpCallResponse(c.CalloutID, nil, nil, nil) // reset: no answer at all
			} else if hs, _ := r.forward(c); get(hs, ":status") != "503" {
				t.Fatalf("attempt %d: the unreachable service's callout answered %s, want Envoy's 503", attempt, get(hs, ":status"))
			}
			if attempt == 3 {
				break
			}
			clock.Advance(199 * time.Millisecond)
			host.Tick()
			if cs := r.next(); len(cs) != 0 {
				t.Fatalf("attempt %d: sent again after 199 ms, want after retry_ms 200", attempt)
			}
			clock.Advance(time.Millisecond)
		}
		clock.Advance(time.Hour)
		host.Tick()
		if cs := r.next(); len(cs) != 0 {
			t.Fatalf("%d callouts after max_attempts 3, want none", len(cs))
		}
		if p := host.GetTickPeriod(); p != 0 {
			t.Errorf("tick period %d ms after the settlement was given up, want 0", p)
		}
		settleCounters(t, host, map[string]uint64{"settle_retries": 2, "settle_failures": 1})
		logs := host.GetErrorLogs()
		if len(logs) != 1 || !strings.Contains(logs[0], "settlement of 300 units failed") || !strings.Contains(logs[0], "after 3 attempts") || !strings.Contains(logs[0], `"api_key":"k1"`) {
			t.Errorf("error logs %q, want one naming the 300 units, the 3 attempts and the attributes", logs)
		}
	})
}

// TestSettleRetriedOnce answers the first attempt with the service's 503 (Redis did
// not take the settlement) and sends the second to the real service: settled once,
// and the counter holds the cost once.
func TestSettleRetriedOnce(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, tokensPolicy)
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "retry_ms": 50}`))
		r := &settleRig{t: t, host: host, clock: clock, envoy: &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}}
		id, _ := r.admitted("k1")
		respond(host, id, [][2]string{{"x-tokens-used", "250"}}, nil)

		c := r.tickOne()
		host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "503"}, {"retry-after", "1"}, {"content-type", "application/json"}}, nil,
			[]byte(`{"error":"settlement not taken, send it again: redis: connection refused"}`))
		clock.Advance(50 * time.Millisecond)
		c2 := r.tickOne()
		if string(c2.Body) != string(c.Body) {
			t.Errorf("second attempt %s, want the first's %s", c2.Body, c.Body)
		}
		if hs, body := r.forward(c2); get(hs, ":status") != "200" {
			t.Fatalf("the service answered the second attempt %s %s, want 200", get(hs, ":status"), body)
		}
		clock.Advance(time.Hour)
		host.Tick()
		if cs := r.next(); len(cs) != 0 {
			t.Errorf("%d more settlement callouts after the 200, want none", len(cs))
		}
		settleCounters(t, host, map[string]uint64{"settled": 1, "settled_units": 250, "settle_retries": 1})
		if logs := host.GetWarnLogs(); len(logs) != 1 || !strings.Contains(logs[0], "503: settlement not taken") {
			t.Errorf("warn logs %q, want one for the retried 503", logs)
		}
		// Charged once: 1 + 250 + 1 of 1000.
		r.admitted("k1")
		if got := get(r.envoy.last, "x-ratelimit-remaining"); got != "748" {
			t.Errorf("after the settlement: X-RateLimit-Remaining %q, want 748 (1 + 250 + 1 charged)", got)
		}
	})
}

// TestSettleNotRetried gives up at once on an answer a retry would get again (400).
func TestSettleNotRetried(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "retry_ms": 10}`))
		r := &settleRig{t: t, host: host, clock: clock}
		id, _ := request(host, "k1", "/v1/chat")
		answer(t, host, id, [][2]string{{":status", "200"}}, `{"allowed":true}`)
		respond(host, id, [][2]string{{"x-tokens-used", "5"}}, nil)
		c := r.tickOne()
		host.CallOnHttpCallResponse(c.CalloutID, [][2]string{{":status", "400"}}, nil, []byte(`{"error":"cost must be 0 to 1048576","field":"cost"}`))
		clock.Advance(time.Second)
		host.Tick()
		if cs := r.next(); len(cs) != 0 {
			t.Errorf("a 400 was sent again (%d callouts)", len(cs))
		}
		settleCounters(t, host, map[string]uint64{"settle_failures": 1})
		if logs := host.GetErrorLogs(); len(logs) != 1 || !strings.Contains(logs[0], "400: cost must be") {
			t.Errorf("error logs %q, want the 400 and its message", logs)
		}
	})
}

// TestSettleNoCost: a response without the cost, or with one that is not a whole
// number from 0 to 2^20, is counted and logged, and nothing is settled; a cost of 0
// without a reservation sends nothing.
func TestSettleNoCost(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used"}`))
		r := &settleRig{t: t, host: host, clock: clock}
		for _, v := range []string{"", "lots", "-3", "1.5", "1048577", "0"} {
			id, _ := request(host, "k1", "/v1/chat")
			answer(t, host, id, [][2]string{{":status", "200"}}, `{"allowed":true}`)
			var hs [][2]string
			if v != "" {
				hs = [][2]string{{"x-tokens-used", v}}
			}
			respond(host, id, hs, nil)
		}
		host.Tick()
		if cs := r.next(); len(cs) != 0 {
			t.Errorf("%d settlements sent, want none", len(cs))
		}
		settleCounters(t, host, map[string]uint64{"settle_no_cost": 5})
		logs := host.GetWarnLogs()
		if len(logs) != 5 || !strings.Contains(logs[0], "no cost in header x-tokens-used; nothing is settled") || !strings.Contains(logs[1], `"lots"`) {
			t.Errorf("warn logs %q, want 5 naming the header", logs)
		}
	})
}

// TestSettleReservation reserves an estimate in the request phase and settles the
// actual cost against it, with the real decision service on a real Redis: the excess
// is charged and the unused part given back, exactly.
func TestSettleReservation(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, tokensPolicy)
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "estimate": 100, "reserve_ttl_ms": 60000}`))
		r := &settleRig{t: t, host: host, clock: clock, envoy: &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}}

		ids := map[string]bool{}
		for i, tc := range []struct {
			actual        int64
			wantRemaining string // after this request's reservation
		}{
			{730, "900"}, // nothing charged yet: 1000 − 100
			{20, "170"},  // 730 settled: 1000 − 730 − 100
			{100, "150"}, // 20 settled (80 given back): 1000 − 750 − 100
		} {
			id, check := r.admitted("k1")
			if *check.Cost != 100 || check.Settle || check.ReserveID == "" || check.ReserveTTLMs != 60000 {
				t.Fatalf("request %d: check %+v, want a reservation of 100 with reserve_ttl_ms 60000", i+1, check)
			}
			if ids[check.ReserveID] {
				t.Errorf("request %d: reserve_id %q used before", i+1, check.ReserveID)
			}
			ids[check.ReserveID] = true
			if got := get(r.envoy.last, "x-ratelimit-remaining"); got != tc.wantRemaining {
				t.Errorf("request %d: X-RateLimit-Remaining %q after its reservation, want %s", i+1, got, tc.wantRemaining)
			}
			respond(host, id, [][2]string{{"x-tokens-used", strconv.FormatInt(tc.actual, 10)}}, nil)
			c := r.tickOne()
			s := decodeCheck(t, c.Body)
			want := sentCheck{Domain: "public-api", Attributes: check.Attributes, Cost: &tc.actual, Settle: true, ReserveID: check.ReserveID}
			if !reflect.DeepEqual(s, want) {
				t.Errorf("request %d: settlement %s, want %+v", i+1, c.Body, want)
			}
			if hs, body := r.forward(c); get(hs, ":status") != "200" {
				t.Fatalf("request %d: the service answered the settlement %s %s", i+1, get(hs, ":status"), body)
			}
		}
		settleCounters(t, host, map[string]uint64{"settled": 3, "settled_units": 850})
	})
}

// TestSettleReservationExpired lets a reservation expire before its settlement: the
// service answers 404 (its estimate stands), and the filter settles the excess over
// the estimate without it, so the counter holds the actual cost.
func TestSettleReservationExpired(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, tokensPolicy)
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "estimate": 100, "reserve_ttl_ms": 1}`))
		r := &settleRig{t: t, host: host, clock: clock, envoy: &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}}
		id, check := r.admitted("k1")
		respond(host, id, [][2]string{{"x-tokens-used", "340"}}, nil)
		time.Sleep(20 * time.Millisecond) // the reservation's 1 ms, in Redis's time
		c := r.tickOne()
		if hs, body := r.forward(c); get(hs, ":status") != "404" {
			t.Fatalf("settling the expired reservation: the service answered %s %s, want 404", get(hs, ":status"), body)
		}
		c = r.tickOne()
		s := decodeCheck(t, c.Body)
		if *s.Cost != 240 || !s.Settle || s.ReserveID != "" || !reflect.DeepEqual(s.Attributes, check.Attributes) {
			t.Errorf("after the 404: settlement %s, want the excess 240 without reserve_id", c.Body)
		}
		if hs, body := r.forward(c); get(hs, ":status") != "200" {
			t.Fatalf("the excess: the service answered %s %s", get(hs, ":status"), body)
		}
		settleCounters(t, host, map[string]uint64{"settled": 1, "settled_units": 240})
		// 100 (the estimate, which stood) + 240 = 340, then this reservation's 100.
		r.admitted("k1")
		if got := get(r.envoy.last, "x-ratelimit-remaining"); got != "560" {
			t.Errorf("X-RateLimit-Remaining %q, want 560 (340 settled, 100 reserved)", got)
		}
	})
}

// TestSettleOnlyUpstream: a request the filter answers itself (429, deny cache) went
// nowhere and settles nothing; one let through by the failure mode settles in full,
// and a degraded reservation (none kept) does too.
func TestSettleOnlyUpstream(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, clock := startFilter(t, b, cfg(`"settle": {"cost_header": "x-tokens-used", "estimate": 50}`))
		r := &settleRig{t: t, host: host, clock: clock}

		id, _ := request(host, "k1", "/v1/chat")
		answer(t, host, id, [][2]string{{":status", "429"}}, `{"allowed":false,"retry_after_ms":60000}`)
		respond(host, id, [][2]string{{"x-tokens-used", "9"}}, nil)

		id, _ = request(host, "k2", "/v1/chat")
		answer(t, host, id, [][2]string{{":status", "503"}}, "upstream connect error") // failure mode open
		respond(host, id, [][2]string{{"x-tokens-used", "70"}}, nil)

		id, _ = request(host, "k3", "/v1/chat")
		answer(t, host, id, [][2]string{{":status", "200"}}, `{"allowed":true,"degraded":true}`)
		respond(host, id, [][2]string{{"x-tokens-used", "80"}}, nil)

		// A client gone while its check was out: no response, nothing spent upstream.
		id, _ = request(host, "k4", "/v1/chat")
		host.CompleteHttpContext(id)

		host.Tick()
		cs := r.next()
		if len(cs) != 2 {
			t.Fatalf("%d settlements, want 2 (the failure mode's and the degraded one's)", len(cs))
		}
		for i, want := range []struct {
			key  string
			cost int64
		}{{"k2", 70}, {"k3", 80}} {
			s := decodeCheck(t, cs[i].Body)
			if s.Attributes["api_key"] != want.key || *s.Cost != want.cost || !s.Settle || s.ReserveID != "" {
				t.Errorf("settlement %d: %s, want %s's whole cost %d without reserve_id", i, cs[i].Body, want.key, want.cost)
			}
		}
		settleCounters(t, host, map[string]uint64{})
	})
}

// FuzzSettleAnswer gives a response any cost header, and its settlement (and the
// settlements that follow it) any answer, on the compiled filter and the native one:
// the VM must not trap, the settlement must end (settled, given up, or nothing to
// settle) within max_attempts, with the tick stopped, and both backends must count
// the same.
func FuzzSettleAnswer(f *testing.F) {
	f.Add("730", "200", "content-type: application/json\n", []byte(`{"allowed":true,"remaining":0}`))
	f.Add("730", "404", "", []byte(`{"error":"reservation \"tg-1\" is unknown, settled or expired","field":"reserve_id"}`))
	f.Add("3", "404", "", []byte(`{}`))
	f.Add("730", "503", "retry-after: 1\n", []byte(`{"error":"settlement not taken, send it again"}`))
	f.Add("730", "", "", []byte(nil))
	f.Add("730", "400", "", []byte(`{"error":"cost must be 0 to 1048576","field":"cost"}`))
	f.Add(" 12 ", "200", "", []byte(`{"allowed":`+strings.Repeat("[", 100)))
	f.Add("1e3", "200", "", []byte(nil))
	f.Add("99999999999999999999", "504", "", []byte("upstream request timeout"))
	config := cfg(`"settle": {"cost_header": "x-tokens-used", "estimate": 10, "max_attempts": 3, "retry_ms": 1}`)
	// Build and compile the module before the first input: a fuzzing worker counts
	// an input that takes over 10 s as hung, and two workers building and compiling
	// at once on two cores come close.
	filterRuntime(f)
	f.Fuzz(func(t *testing.T, cost, status, headers string, body []byte) {
		hs := parseHeaders(headers)
		if status != "" {
			hs = append([][2]string{{":status", status}}, hs...)
		}
		var got [2][6]uint64
		for i, b := range backends {
			host, clock := startFilter(t, b, config)
			r := &settleRig{t: t, host: host, clock: clock}
			id, _ := request(host, "k1", "/v1/chat")
			answer(t, host, id, [][2]string{{":status", "200"}}, `{"allowed":true}`)
			respond(host, id, [][2]string{{"x-tokens-used", cost}}, nil)
			sent := uint64(0)
			for round := 0; round < 8; round++ {
				host.Tick()
				for _, c := range r.next() {
					sent++
					host.CallOnHttpCallResponse(c.CalloutID, hs, nil, body)
				}
				clock.Advance(time.Millisecond)
			}
			if p := host.GetTickPeriod(); p != 0 {
				t.Fatalf("%s: cost %q, answer %q %q %q: tick period %d after 8 rounds, want 0", b, cost, status, headers, body, p)
			}
			if sent > 6 {
				t.Fatalf("%s: cost %q, answer %q: %d settlement callouts, want at most 2 × max_attempts", b, cost, status, sent)
			}
			got[i][0] = sent
			for j, name := range []string{"settled", "settled_units", "settle_retries", "settle_failures", "settle_no_cost"} {
				got[i][j+1] = counter(t, host, "tollgate."+name)
			}
		}
		if got[0] != got[1] {
			t.Errorf("cost %q, answer %q %q %q: native %v, wasm %v (callouts, settled, units, retries, failures, no cost); want the same", cost, status, headers, body, got[0], got[1])
		}
	})
}
