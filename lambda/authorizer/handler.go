package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambdacontext"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/emf"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

// ErrUnauthorized is the error API Gateway turns into 401 Unauthorized: its message
// must be exactly "Unauthorized".
var ErrUnauthorized = errors.New("Unauthorized") //nolint:staticcheck // API Gateway matches this exact text

// The keys of the context map the authorizer returns. API Gateway passes them on as
// $context.authorizer.<key>, for gateway responses (the 429's headers), mapping
// templates and the integration.
const (
	ctxLimit           = "limit"
	ctxRemaining       = "remaining"
	ctxReset           = "reset"
	ctxRetryAfter      = "retryAfter"
	ctxRateLimit       = "rateLimit"
	ctxRateLimitPolicy = "rateLimitPolicy"
	ctxRule            = "rule"
	ctxPlan            = "plan" // the plan the policy's table gave the key, when it has plans
)

// Results of a decision, the Result dimension of the Decisions metric.
const (
	resultAllowed      = "allowed"
	resultDenied       = "denied"
	resultUnavailable  = "unavailable"
	resultUnauthorized = "unauthorized"
	resultBadEvent     = "bad_event"
	resultError        = "error"
)

// Handler answers API Gateway authorizer events. It is safe for simultaneous use.
type Handler struct {
	eng      *engine.Engine
	x        atomic.Pointer[extractor] // for the engine's current policy
	policy   *reload.Reloader
	ttl      time.Duration
	usageKey bool
	metrics  *metrics
	log      *slog.Logger
}

// HandlerConfig configures a Handler.
type HandlerConfig struct {
	// Engine decides the requests (required).
	Engine *engine.Engine
	// UsageIdentifierKey returns the request's API key (REST REQUEST) or token (REST
	// TOKEN) as usageIdentifierKey, for usage plans whose API key source is
	// AUTHORIZER.
	UsageIdentifierKey bool
	// Metrics writes EMF lines; nil for none.
	Metrics *emf.Logger
	// Function is the Function dimension of the metrics.
	Function string
	// Logger receives the logs (default slog.Default()).
	Logger *slog.Logger
	// Policy, if set, is read again before an invocation once PolicyTTL has passed
	// since it was last read (TOLLGATE_POLICY_POLL): a Lambda function is frozen between
	// invocations, so nothing can poll it in the background.
	Policy    *reload.Reloader
	PolicyTTL time.Duration
}

// NewHandler returns a handler for cfg.
func NewHandler(cfg HandlerConfig) (*Handler, error) {
	if cfg.Engine == nil {
		return nil, errors.New("authorizer: nil engine")
	}
	p := cfg.Engine.Policy()
	h := &Handler{
		eng:      cfg.Engine,
		policy:   cfg.Policy,
		ttl:      cfg.PolicyTTL,
		usageKey: cfg.UsageIdentifierKey,
		log:      cfg.Logger,
	}
	h.x.Store(newExtractor(p))
	if h.log == nil {
		h.log = slog.Default()
	}
	if cfg.Metrics != nil {
		h.metrics = &metrics{emf: cfg.Metrics, function: cfg.Function, log: h.log}
	}
	return h, nil
}

// Handle answers one event: a REST API TOKEN or REQUEST event with an IAM policy
// (Allow or Deny on the method ARN), an HTTP API 2.0 event with a simple response
// ({isAuthorized, context}). A request that lacks an identity the policy requires
// fails with ErrUnauthorized (see unauthorized); an event the authorizer cannot read
// fails with an error wrapping ErrBadEvent. Being over a limit is a Deny, never an
// error; a Redis failure is decided by the policy's failure mode.
func (h *Handler) Handle(ctx context.Context, raw []byte) (any, error) {
	start := time.Now()
	reqID := ""
	if lc, ok := lambdacontext.FromContext(ctx); ok {
		reqID = lc.AwsRequestID
	}
	if h.policy != nil {
		h.policy.Refresh(ctx, h.ttl)
	}
	pol := h.eng.Policy()
	x := h.x.Load()
	if x.pol != pol {
		x = newExtractor(pol)
		h.x.Store(x)
	}
	r, err := x.decode(raw)
	if err != nil {
		h.log.Warn("cannot answer the event", "request_id", reqID, "err", err)
		h.metrics.record(start, "none", resultBadEvent, false, false)
		return nil, err
	}
	plan, err := h.eng.Plan(engine.Request{Domain: pol.Domain, Attributes: r.attrs, Cost: 1, KeyHashed: r.keyHashed})
	if err != nil {
		h.log.Error("decision failed", "request_id", reqID, "event", r.shape.String(), "err", err)
		h.metrics.record(start, "none", resultError, false, false)
		return nil, fmt.Errorf("authorizer: decide: %w", err)
	}
	if !r.identity && r.principal == anonymous && plan.Client != "" {
		r.principal = plan.Client
	}
	if unauthorized(r, plan) {
		h.log.Info("unauthorized: no API key or token, and no rule limits the request without one",
			"request_id", reqID, "event", r.shape.String(), "principal", r.principal)
		h.metrics.record(start, "none", resultUnauthorized, false, plan.AddressFellBack)
		return nil, ErrUnauthorized
	}
	v := h.eng.Decide(ctx, plan)
	result := resultAllowed
	switch {
	case v.Reason == engine.ReasonUnavailable:
		result = resultUnavailable
	case !v.Allowed:
		result = resultDenied
	}
	h.metrics.record(start, v.Rule, result, v.Degraded, plan.AddressFellBack)
	h.log.Debug("decided", "request_id", reqID, "event", r.shape.String(), "principal", r.principal,
		"result", result, "rule", v.Rule, "degraded", v.Degraded)
	c := decisionContext(v)
	if pl := pol.Plans; pl != nil && plan.Attributes[pl.Attribute] != "" {
		// The backend (and a decision service behind it, through a header mapped from
		// $context.authorizer.plan) learns the key's plan without the table.
		c[ctxPlan] = plan.Attributes[pl.Attribute]
	}
	switch r.shape {
	case httpV2:
		return events.APIGatewayV2CustomAuthorizerSimpleResponse{IsAuthorized: v.Allowed, Context: c}, nil
	default:
		resp := events.APIGatewayCustomAuthorizerResponse{
			PrincipalID:    r.principal,
			PolicyDocument: policyDocument(v.Allowed, r.arn),
			Context:        c,
		}
		if h.usageKey {
			resp.UsageIdentifierKey = r.usageKey
		}
		return resp, nil
	}
}

// unauthorized reports whether r lacks an identity the policy requires: a missing
// identity is an authentication failure (401), not a rate-limit denial. A TOKEN
// authorizer always requires its token; otherwise the policy requires an API key of a
// request when only rules keyed on api_key could limit it (policy.KeyRequired). A
// request that a rule limits without a key (POST /login by client address, /search
// globally) is decided, not rejected; one that no rule could limit is decided too
// (and allowed).
func unauthorized(r request, plan engine.Plan) bool {
	if r.shape == restToken {
		return !r.identity
	}
	return plan.KeyRequired
}

// Invoke answers one event as raw JSON; it makes the Handler a lambda.Handler, so
// that the handler sees the event's bytes (and reports garbage itself) and encodes
// its answer once.
func (h *Handler) Invoke(ctx context.Context, payload []byte) ([]byte, error) {
	resp, err := h.Handle(ctx, payload)
	if err != nil {
		return nil, err
	}
	return json.Marshal(resp)
}

// policyDocument allows or denies execute-api:Invoke on arn.
func policyDocument(allow bool, arn string) events.APIGatewayCustomAuthorizerPolicy {
	effect := "Deny"
	if allow {
		effect = "Allow"
	}
	return events.APIGatewayCustomAuthorizerPolicy{
		Version: "2012-10-17",
		Statement: []events.IAMPolicyStatement{{
			Action:   []string{"execute-api:Invoke"},
			Effect:   effect,
			Resource: []string{arn},
		}},
	}
}

// decisionContext is the context map of a verdict: the deciding limit's quota as the
// headers state it (Verdict.Quota) and its times in whole seconds, and its RateLimit and RateLimit-Policy header values. retryAfter is
// 0 when the request is allowed. With no rule matched every number is 0 and the
// header values are empty.
func decisionContext(v engine.Verdict) map[string]any {
	d := v.Decision
	retry := int64(0)
	if !v.Allowed {
		retry = algo.RetryAfterSeconds(d.RetryAfter)
	}
	c := map[string]any{
		ctxLimit:           v.Quota,
		ctxRemaining:       max(0, d.Remaining),
		ctxReset:           algo.Seconds(d.ResetAfter),
		ctxRetryAfter:      retry,
		ctxRateLimit:       "",
		ctxRateLimitPolicy: "",
		ctxRule:            v.Rule,
	}
	for _, kv := range v.Headers() {
		switch kv[0] {
		case "RateLimit":
			c[ctxRateLimit] = kv[1]
		case "RateLimit-Policy":
			c[ctxRateLimitPolicy] = kv[1]
		}
	}
	return c
}

// metrics writes one EMF line per invocation: Decisions by Function, Rule and
// Result; DecisionLatency, FailureModeActivations and IdentityFallbacks (an
// X-Forwarded-For whose trusted entry was unusable, see identity.Address) by
// Function.
type metrics struct {
	emf      *emf.Logger
	function string
	log      *slog.Logger
}

// reloaded writes a PolicyReloads count by Function and Result (reload.Applied,
// Unchanged, Invalid or Failed): the authorizer's tollgate_policy_reloads_total.
func (m *metrics) reloaded(result string) {
	if m == nil || result == reload.Unchanged {
		return
	}
	m.write(emf.Line{
		Time:       time.Now(),
		Properties: map[string]string{"Function": m.function, "Result": result},
		Directives: []emf.Directive{{Dimensions: [][]string{{"Function", "Result"}}, Metrics: []emf.Metric{{Name: "PolicyReloads", Unit: emf.Count, Value: 1}}}},
	})
}

// write writes one EMF line, logging a failure.
func (m *metrics) write(l emf.Line) {
	if err := m.emf.Write(l); err != nil && m.log != nil {
		m.log.Warn("cannot write metrics", "err", err)
	}
}

func (m *metrics) record(start time.Time, rule, result string, degraded, addrFallback bool) {
	if m == nil {
		return
	}
	if rule == "" {
		rule = "none"
	}
	activations, fallbacks := 0.0, 0.0
	if degraded {
		activations = 1
	}
	if addrFallback {
		fallbacks = 1
	}
	now := time.Now()
	m.write(emf.Line{
		Time:       now,
		Properties: map[string]string{"Function": m.function, "Rule": rule, "Result": result},
		Directives: []emf.Directive{
			{Dimensions: [][]string{{"Function", "Rule", "Result"}}, Metrics: []emf.Metric{{Name: "Decisions", Unit: emf.Count, Value: 1}}},
			{Dimensions: [][]string{{"Function"}}, Metrics: []emf.Metric{
				{Name: "DecisionLatency", Unit: emf.Milliseconds, Value: float64(now.Sub(start).Microseconds()) / 1000},
				{Name: "FailureModeActivations", Unit: emf.Count, Value: activations},
				{Name: "IdentityFallbacks", Unit: emf.Count, Value: fallbacks},
			}},
		},
	})
}
