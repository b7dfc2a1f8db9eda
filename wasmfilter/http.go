package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/wasmfilter/internal/jsonv"
)

// maxCalloutBody bounds the decision service's answer: a longer body is not read at
// all (a prefix would not parse), and its JSON fields count as absent.
const maxCalloutBody = 64 << 10

// tooManyRequests is the "error" of the filter's 429 bodies.
const tooManyRequests = "too many requests"

// rateLimitHeaders are the decision service's headers that are passed on to the client.
var rateLimitHeaders = []string{"ratelimit-policy", "ratelimit", "x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset"}

// httpContext is one request. Its state lives here, never in maps keyed by callout
// ID: Envoy reuses callout IDs.
type httpContext struct {
	types.DefaultHttpContext
	contextID uint32
	plugin    *pluginContext

	attrs     []value
	identity  string // the deny cache's key for this client
	cacheable bool   // identity is set and the deny cache is on

	// respHeaders are added to the response once, by OnHttpResponseHeaders.
	respHeaders [][2]string
	// headersDone is set once the response needs no more headers: they were added,
	// or the filter sent a local reply (which passes OnHttpResponseHeaders too).
	headersDone bool

	// settle is what the stream settles at its end (with a settle block): plain
	// once the request goes upstream, reserved once the service kept its
	// reservation (reserveID), none once the filter answered it.
	settle    settleKind
	reserveID string
	// cost is the response's cost, read from its header or trailer: costSeen when
	// either came, costOK when it is a valid cost (costText as it came).
	cost     int64
	costText string
	costSeen bool
	costOK   bool
	// responded is set once response headers came (the upstream's, or Envoy's own).
	responded bool
}

func (h *httpContext) OnHttpRequestHeaders(numHeaders int, endOfStream bool) types.Action {
	p := h.plugin
	if p.cfg == nil {
		return types.ActionContinue
	}
	headers, err := proxywasm.GetHttpRequestHeaders()
	if err != nil {
		proxywasm.LogWarnf("tollgate: read the request headers: %v", err)
	}
	info := requestInfo{headers: headers}
	if p.cfg.needs(fromSourceAddress) {
		if b, err := proxywasm.GetProperty([]string{"source", "address"}); err == nil {
			info.sourceAddress = string(b)
		}
	}
	attrs, tooLong := buildAttributes(p.cfg, info)
	if tooLong != "" {
		p.metrics.rejected.Increment(1)
		body := append([]byte(`{"error":"attribute too long","field":`), jsonv.AppendString(nil, tooLong, true)...)
		return h.reply(400, nil, append(body, '}'))
	}
	h.attrs = attrs
	if p.cache != nil {
		h.identity, h.cacheable = p.cfg.identity(attrs)
		if h.cacheable {
			now := p.now()
			if e, ok := p.cache.lookup(h.identity, now); ok {
				p.metrics.cacheHits.Increment(1)
				p.metrics.denied.Increment(1)
				return h.reply(429, e.headers(now), refusalBody(tooManyRequests, p.cfg.domain, e.rule, time.Duration(e.until-now.UnixMilli())*time.Millisecond))
			}
		}
	}
	callout := p.cfg.calloutHeaders()
	check := checkRequest{domain: p.cfg.domain, attrs: attrs, cost: p.cfg.cost}
	if s := p.cfg.settle; s != nil {
		h.settle = settlePlain
		if s.estimate > 0 {
			h.reserveID = newReserveID(p.now(), h.contextID)
			check.cost, check.reserveID, check.reserveTTL = s.estimate, h.reserveID, s.reserveTTL
		}
	}
	body := check.body()
	if len(body) > bounds.MaxBody {
		// Only escaping can do this (a value of control characters is six times its
		// length): the decision service would refuse it as a client error too.
		p.metrics.rejected.Increment(1)
		return h.reply(400, nil, []byte(`{"error":"attributes too large: the check body is over `+strconv.Itoa(bounds.MaxBody)+` bytes once JSON-escaped","field":"attributes"}`))
	}
	if _, err := proxywasm.DispatchHttpCall(p.cfg.cluster, callout, body, nil, uint32(p.cfg.timeout/time.Millisecond), h.onCheckResponse); err != nil {
		p.metrics.calloutFailures.Increment(1)
		return h.failureMode("dispatch to cluster " + strconv.Quote(p.cfg.cluster) + ": " + err.Error())
	}
	return types.ActionPause
}

// onCheckResponse receives the decision service's answer (200, 429, or a 503 verdict
// when its policy fails closed), or Envoy's word that the callout failed (a 503 or 504
// of its own, or no headers at all).
func (h *httpContext) onCheckResponse(numHeaders, bodySize, numTrailers int) {
	if h.decide(numHeaders, bodySize) == types.ActionContinue {
		if err := proxywasm.ResumeHttpRequest(); err != nil {
			proxywasm.LogWarnf("tollgate: resume request: %v", err)
		}
	}
}

// decide acts on the callout's answer. It returns ActionContinue when the request
// should go on now, and ActionPause when it was answered locally or is held.
func (h *httpContext) decide(numHeaders, bodySize int) types.Action {
	var headers [][2]string
	if numHeaders > 0 {
		var err error
		if headers, err = proxywasm.GetHttpCallResponseHeaders(); err != nil {
			headers = nil
		}
	}
	status, _ := headerValue(headers, ":status")
	var answer answerBody
	if bodySize > maxCalloutBody {
		// The service's answers are a few hundred bytes: this is not one of them.
		proxywasm.LogWarnf("tollgate: the decision callout's %s answer is %d bytes, over the limit of %d; its body is ignored", status, bodySize, maxCalloutBody)
	} else if bodySize > 0 {
		body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		var err error
		if answer, err = parseAnswerErr(body); tooDeep(err) {
			proxywasm.LogWarnf("tollgate: the decision callout's %s answer nests arrays and objects more than %d deep; its body is ignored", status, answerMaxDepth)
		}
	}
	switch {
	case status == "200": // allowed: the request goes on, now or after the shaping delay
		h.respHeaders = pick(headers, rateLimitHeaders)
		if h.reserveID != "" && !answer.degraded {
			// A degraded answer kept no reservation: the whole cost is settled.
			h.settle = settleReserved
		}
		return h.admit(answer.delay, answer.rule)
	case status == "429":
		return h.denied(headers, answer)
	case status == "503" && unavailableVerdict(answer):
		return h.unavailable(headers, answer)
	case status == "":
		h.plugin.metrics.calloutFailures.Increment(1)
		return h.failureMode("the callout failed without a response")
	default:
		h.plugin.metrics.calloutFailures.Increment(1)
		reason := "the callout returned status " + status
		if answer.hasMessage {
			reason += ": " + answer.message
		}
		return h.failureMode(reason)
	}
}

// admit lets the request go on after delay, holding it meanwhile. A delay beyond
// max_delay_ms, or one that finds max_held_requests already held, is answered 429.
func (h *httpContext) admit(delay time.Duration, rule string) types.Action {
	p := h.plugin
	if delay <= 0 {
		p.metrics.allowed.Increment(1)
		return types.ActionContinue
	}
	if delay > p.cfg.maxDelay || !p.hold(h.contextID, p.now().Add(delay)) {
		p.metrics.denied.Increment(1)
		return h.refuse(429, tooManyRequests, rule, delay, h.respHeaders)
	}
	p.metrics.shaped.Increment(1)
	p.metrics.allowed.Increment(1)
	return types.ActionPause
}

// denied handles a 429: answer it locally with the service's headers, and remember
// the client in the deny cache until its retry time.
func (h *httpContext) denied(headers [][2]string, answer answerBody) types.Action {
	p := h.plugin
	if p.cache != nil && h.cacheable && answer.retry > 0 {
		now := p.now()
		e := denyEntry{
			identity: h.identity,
			until:    now.Add(answer.retry).UnixMilli(),
			stored:   now.UnixMilli(),
			rule:     answer.rule,
		}
		e.policy, _ = headerValue(headers, "ratelimit-policy")
		e.limit, _ = headerValue(headers, "ratelimit")
		e.xLimit, _ = headerValue(headers, "x-ratelimit-limit")
		e.xReset, _ = headerValue(headers, "x-ratelimit-reset")
		if err := p.cache.store(e); err != nil {
			proxywasm.LogWarnf("tollgate: cache the denial: %v", err)
		}
	}
	p.metrics.denied.Increment(1)
	return h.refuse(429, tooManyRequests, answer.rule, answer.retry, pick(headers, rateLimitHeaders))
}

// unavailable handles the service's 503 verdict: its store is down and its policy
// fails closed. That is the service's decision, so the filter replies 503 itself,
// retrying after the service's retry_after_ms (1 second when it sends none). The
// filter's own failure mode does not apply, and the deny cache is left alone: the
// client did nothing to be remembered for.
func (h *httpContext) unavailable(headers [][2]string, answer answerBody) types.Action {
	retry := answer.retry
	if retry <= 0 {
		retry = time.Second
	}
	h.plugin.metrics.unavailable.Increment(1)
	proxywasm.LogWarnf("tollgate: the decision service is unavailable and its policy fails closed; replying 503 (Retry-After %d)", algo.RetryAfterSeconds(retry))
	return h.refuse(503, "rate limiter unavailable", answer.rule, retry, pick(headers, rateLimitHeaders))
}

// refuse answers the request locally with status: Retry-After is retry in whole
// seconds (algo.RetryAfterSeconds, as the decision service writes it), then the
// rate-limit headers passed, and the body is refusalBody's.
func (h *httpContext) refuse(status uint32, message, rule string, retry time.Duration, passed [][2]string) types.Action {
	hs := append([][2]string{{"retry-after", strconv.FormatInt(algo.RetryAfterSeconds(retry), 10)}}, passed...)
	return h.reply(status, hs, refusalBody(message, h.plugin.cfg.domain, rule, retry))
}

// failureMode decides a request whose callout failed.
func (h *httpContext) failureMode(reason string) types.Action {
	p := h.plugin
	p.metrics.failureMode.Increment(1)
	proxywasm.LogWarnf("tollgate: decision callout failed (%s); failure mode %s", reason, p.cfg.failureMode)
	switch p.cfg.failureMode {
	case failClosed:
		return h.reply(503, [][2]string{{"retry-after", "1"}}, []byte(`{"error":"rate limiter unavailable"}`))
	case failLocal:
		return h.local()
	default:
		p.metrics.allowed.Increment(1)
		return types.ActionContinue
	}
}

// local decides the request with the local limits.
func (h *httpContext) local() types.Action {
	p := h.plugin
	now := p.now()
	v := p.local.decide(h.attrs, p.cfg.cost, now)
	if v.name != "" {
		for _, kv := range algo.Headers(v.quotas, v.deciding) {
			name := strings.ToLower(kv[0])
			if name != "retry-after" {
				h.respHeaders = append(h.respHeaders, [2]string{name, kv[1]})
			}
		}
	}
	if v.allowed {
		return h.admit(v.delay, v.name)
	}
	p.metrics.denied.Increment(1)
	return h.refuse(429, tooManyRequests, v.name, v.decision.RetryAfter, h.respHeaders)
}

// reply sends a local response with a JSON body and returns ActionPause, the action
// that must follow it. If the response cannot be sent the request goes on.
func (h *httpContext) reply(status uint32, headers [][2]string, body []byte) types.Action {
	h.headersDone = true
	h.settle = settleNone
	headers = append(headers, [2]string{"content-type", "application/json"})
	if err := proxywasm.SendHttpResponse(status, headers, body, -1); err != nil {
		proxywasm.LogErrorf("tollgate: send the local %d response: %v", status, err)
		return types.ActionContinue
	}
	return types.ActionPause
}

func (h *httpContext) OnHttpResponseHeaders(numHeaders int, endOfStream bool) types.Action {
	h.responded = true
	if s := h.settleConfig(); s != nil {
		h.readCost(s.costHeader, proxywasm.GetHttpResponseHeader)
	}
	if h.headersDone {
		return types.ActionContinue
	}
	h.headersDone = true
	for _, kv := range h.respHeaders {
		if err := proxywasm.AddHttpResponseHeader(kv[0], kv[1]); err != nil {
			proxywasm.LogWarnf("tollgate: add response header %s: %v", kv[0], err)
		}
	}
	return types.ActionContinue
}

// OnHttpResponseTrailers reads the cost from the configured trailer.
func (h *httpContext) OnHttpResponseTrailers(numTrailers int) types.Action {
	if s := h.settleConfig(); s != nil {
		h.readCost(s.costTrailer, proxywasm.GetHttpResponseTrailer)
	}
	return types.ActionContinue
}

func (h *httpContext) OnHttpStreamDone() {
	h.plugin.release(h.contextID)
	h.settleAtEnd()
}

// settleConfig returns the settle block, or nil without one (or without a
// configuration).
func (h *httpContext) settleConfig() *settleConfig {
	if h.plugin.cfg == nil {
		return nil
	}
	return h.plugin.cfg.settle
}

// refusalBody is the JSON body of a request the filter answers itself because it was
// not allowed: {"allowed":false,"error":message,"domain":…,"rule":…,"retry_after_ms":…},
// without "rule" when rule is empty.
func refusalBody(message, domain, rule string, retry time.Duration) []byte {
	b := append([]byte(nil), `{"allowed":false,"error":`...)
	b = jsonv.AppendString(b, message, true)
	b = append(b, `,"domain":`...)
	b = jsonv.AppendString(b, domain, true)
	if rule != "" {
		b = append(b, `,"rule":`...)
		b = jsonv.AppendString(b, rule, true)
	}
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, max(0, retry.Milliseconds()), 10)
	return append(b, '}')
}

// headerValue returns the first value of a header; names are lower-case.
func headerValue(headers [][2]string, name string) (string, bool) {
	for _, h := range headers {
		if strings.EqualFold(h[0], name) {
			return h[1], true
		}
	}
	return "", false
}

// pick returns the headers named in names, in the order of names, names lower-cased.
func pick(headers [][2]string, names []string) [][2]string {
	var out [][2]string
	for _, n := range names {
		if v, ok := headerValue(headers, n); ok {
			out = append(out, [2]string{n, v})
		}
	}
	return out
}

// calloutHeaders are the headers of a POST to the decision service's check path.
func (c *config) calloutHeaders() [][2]string {
	return [][2]string{
		{":method", "POST"},
		{":path", c.path},
		{":authority", c.authority},
		{"content-type", "application/json"},
		{"accept", "application/json"},
	}
}

// needs reports whether some attribute comes from src.
func (c *config) needs(src source) bool {
	for _, a := range c.attributes {
		if a.from == src {
			return true
		}
	}
	return false
}

// identity returns the deny cache's identity of a request: its deny_cache.key
// attributes (every attribute when the key is not set) as a JSON object. ok is false
// when a key attribute is missing, or the request carries no attribute at all.
func (c *config) identity(attrs []value) (id string, ok bool) {
	if len(c.denyCacheKey) == 0 {
		if len(attrs) == 0 {
			return "", false
		}
		return string(appendJSONObject(nil, attrs)), true
	}
	kv, ok := pickAll(attrs, c.denyCacheKey)
	if !ok {
		return "", false
	}
	return string(appendJSONObject(nil, kv)), true
}
