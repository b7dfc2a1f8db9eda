package main

import (
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"

	"github.com/tollgate-dev/tollgate/shared/bounds"
)

// Settlements: with a settle block, the cost of a response (an LLM's tokens) is read
// from a response header or trailer and charged after the stream with
// {"settle": true, "cost": N} (+ the request's reserve_id when an estimate was
// reserved first). The charge is never refused by the service: it may leave a debt.
//
// The callout is made from the plugin context, never from the stream's: the SDK
// drops the answer of a callout whose calling context was deleted (and the stream's
// is deleted right after OnHttpStreamDone), and Envoy's callout belongs to the root
// context, so it outlives the stream. The SDK registers a callout under the context
// active when it is dispatched, which the filter cannot choose; in OnTick it is the
// plugin's. So the stream queues its settlement, and the plugin's tick sends it,
// and sends it again after retry_ms when it fails.

// A settleKind says what a stream settles at its end.
type settleKind uint8

const (
	settleNone     settleKind = iota // nothing: no settle block, or the request never went upstream
	settlePlain                      // the whole cost
	settleReserved                   // the cost against the request's reservation
)

// A settlement is a cost to charge after the response: waiting in the plugin's queue
// for its (next) attempt, or in flight.
type settlement struct {
	attrs     []value
	cost      int64
	reserveID string // "" for a plain settlement
	estimate  int64  // the reservation's estimate, with reserveID
	attempts  int    // callouts made
	due       time.Time
}

// newReserveID returns an id for one request's reservation: random, with the
// worker's clock and the stream's context id, so that ids do not repeat across
// workers and proxies. The client's headers (x-request-id) are not used: a client
// must not name another's reservation.
func newReserveID(now time.Time, contextID uint32) string {
	b := make([]byte, 0, 48)
	b = append(b, "tg-"...)
	b = strconv.AppendUint(b, rand.Uint64(), 36)
	b = append(b, '-')
	b = strconv.AppendInt(b, now.UnixNano(), 36)
	b = append(b, '-')
	b = strconv.AppendUint(b, uint64(contextID), 36)
	return string(b)
}

// parseCost reads a cost as the response carries it: a whole number from 0 to
// bounds.MaxCost (the most the service settles at once).
func parseCost(s string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > bounds.MaxCost {
		return 0, false
	}
	return n, true
}

// readCost takes the cost from the response's header or trailer named name, if the
// stream is to settle and name is configured.
func (h *httpContext) readCost(name string, get func(string) (string, error)) {
	if h.settle == settleNone || name == "" {
		return
	}
	v, err := get(name)
	if err != nil {
		return
	}
	h.costSeen = true
	h.costText = v
	h.cost, h.costOK = parseCost(v)
}

// settleAtEnd queues the stream's settlement, once its stream is done.
func (h *httpContext) settleAtEnd() {
	p := h.plugin
	s := h.settleConfig()
	if h.settle == settleNone || s == nil {
		return
	}
	kind := h.settle
	h.settle = settleNone
	if !h.responded {
		// The client went away before any response (while its check was out, say):
		// nothing was spent upstream that a response could report.
		if kind == settleReserved {
			proxywasm.LogInfof("tollgate: the stream ended without a response; reservation %s's estimate of %d stands", h.reserveID, s.estimate)
		}
		return
	}
	if !h.costOK {
		p.metrics.settleNoCost.Increment(1)
		what := "no cost"
		if h.costSeen {
			what = "the cost " + strconv.Quote(h.costText) + ", not a whole number from 0 to " + strconv.Itoa(bounds.MaxCost) + ","
		}
		stands := "nothing is settled"
		if kind == settleReserved {
			stands = "the reservation's estimate of " + strconv.FormatInt(s.estimate, 10) + " stands"
		}
		proxywasm.LogWarnf("tollgate: the response carries %s in %s; %s", what, costSource(s), stands)
		return
	}
	st := &settlement{attrs: h.attrs, cost: h.cost, due: p.now()}
	if kind == settleReserved {
		st.reserveID, st.estimate = h.reserveID, s.estimate
	} else if h.cost == 0 {
		return // nothing was spent, and nothing reserved
	}
	p.queueSettle(st)
}

// costSource names where the cost is read, for logs.
func costSource(s *settleConfig) string {
	switch {
	case s.costHeader != "" && s.costTrailer != "":
		return "header " + s.costHeader + " or trailer " + s.costTrailer
	case s.costHeader != "":
		return "header " + s.costHeader
	}
	return "trailer " + s.costTrailer
}

// queueSettle queues a settlement for the next tick, unless max_pending are already
// waiting or in flight.
func (p *pluginContext) queueSettle(s *settlement) {
	if len(p.settles)+p.settlesInFlight >= p.cfg.settle.maxPending {
		p.settleFailed(s, "max_pending ("+strconv.Itoa(p.cfg.settle.maxPending)+") settlements are already waiting")
		return
	}
	p.settles = append(p.settles, s)
	p.startTick()
}

// sendSettles sends the settlements that are due. It runs in OnTick, where the
// plugin's context is the SDK's active one, so their answers outlive the streams.
func (p *pluginContext) sendSettles(now time.Time) {
	var due []*settlement
	kept := p.settles[:0]
	for _, s := range p.settles {
		if s.due.After(now) {
			kept = append(kept, s)
		} else {
			due = append(due, s)
		}
	}
	clear(p.settles[len(kept):])
	p.settles = kept
	for _, s := range due {
		p.sendSettle(s)
	}
}

// sendSettle makes one attempt at a settlement.
func (p *pluginContext) sendSettle(s *settlement) {
	s.attempts++
	body := checkRequest{domain: p.cfg.domain, attrs: s.attrs, cost: s.cost, settle: true, reserveID: s.reserveID}.body()
	if len(body) > bounds.MaxBody {
		p.settleFailed(s, "its body is "+strconv.Itoa(len(body))+" bytes once JSON-escaped, over the service's "+strconv.Itoa(bounds.MaxBody))
		return
	}
	headers := p.cfg.calloutHeaders()
	_, err := proxywasm.DispatchHttpCall(p.cfg.cluster, headers, body, nil, uint32(p.cfg.timeout/time.Millisecond),
		func(numHeaders, bodySize, numTrailers int) { p.onSettleResponse(s, numHeaders, bodySize) })
	if err != nil {
		p.retrySettle(s, "dispatch to cluster "+strconv.Quote(p.cfg.cluster)+": "+err.Error())
		return
	}
	p.settlesInFlight++
}

// onSettleResponse acts on the service's answer to a settlement: 200 settled; 404
// an unknown, expired or settled reservation; 503 (Redis did not take it), Envoy's
// 503 or 504, no answer, or any other 5xx: sent again; any other status (400: the
// request is wrong, and would be again) given up.
func (p *pluginContext) onSettleResponse(s *settlement, numHeaders, bodySize int) {
	p.settlesInFlight--
	var headers [][2]string
	if numHeaders > 0 {
		headers, _ = proxywasm.GetHttpCallResponseHeaders()
	}
	status, _ := headerValue(headers, ":status")
	var answer answerBody
	if bodySize > 0 && bodySize <= maxCalloutBody {
		body, _ := proxywasm.GetHttpCallResponseBody(0, bodySize)
		answer = parseAnswer(body)
	}
	reason := "the service answered " + status
	if answer.hasMessage {
		reason += ": " + answer.message
	}
	switch {
	case status == "200":
		p.metrics.settled.Increment(1)
		p.metrics.settledUnits.Increment(uint64(s.cost))
	case status == "404" && s.reserveID != "":
		// The reservation is gone: expired (its estimate stands), or settled by an
		// attempt whose answer was lost. Charge what the estimate did not cover, as
		// a plain settlement; a lost answer may so charge the excess twice, never zero
		// times.
		excess := s.cost - s.estimate
		proxywasm.LogWarnf("tollgate: settlement of reservation %s: %s; its estimate of %d stands, settling the excess of %d without it",
			s.reserveID, reason, s.estimate, max(0, excess))
		if excess > 0 {
			p.queueSettle(&settlement{attrs: s.attrs, cost: excess, due: p.now()})
		}
	case status == "" || status == "429" || strings.HasPrefix(status, "5"):
		if status == "" {
			reason = "the callout failed without a response"
		}
		p.retrySettle(s, reason)
	default:
		p.settleFailed(s, reason+" (not sent again)")
	}
}

// retrySettle queues a failed attempt again after retry_ms, or gives the settlement
// up after max_attempts.
func (p *pluginContext) retrySettle(s *settlement, reason string) {
	cfg := p.cfg.settle
	if s.attempts >= cfg.maxAttempts {
		p.settleFailed(s, reason+", after "+strconv.Itoa(s.attempts)+" attempts")
		return
	}
	p.metrics.settleRetries.Increment(1)
	proxywasm.LogWarnf("tollgate: settlement of %d units failed (%s); sending it again in %d ms (attempt %d of %d)",
		s.cost, reason, cfg.retry.Milliseconds(), s.attempts+1, cfg.maxAttempts)
	s.due = p.now().Add(cfg.retry)
	p.settles = append(p.settles, s)
	p.startTick()
}

// settleFailed gives a settlement up: counted, and logged with what was not charged.
func (p *pluginContext) settleFailed(s *settlement, reason string) {
	p.metrics.settleFailures.Increment(1)
	what := strconv.FormatInt(s.cost, 10) + " units"
	if s.reserveID != "" {
		what += " against reservation " + s.reserveID + " (its estimate of " + strconv.FormatInt(s.estimate, 10) + " stands)"
	}
	proxywasm.LogErrorf("tollgate: settlement of %s failed and is dropped: %s; attributes %s", what, reason, appendJSONObject(nil, s.attrs))
}
