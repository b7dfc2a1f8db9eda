package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-lambda-go/events"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// MaxEventBytes is the largest event the authorizer decodes. API Gateway bounds a
// request's headers and query string to about 10 KiB each, so a real authorizer event
// is far smaller; anything larger is not from API Gateway.
const MaxEventBytes = 256 << 10

// The attributes the authorizer fills from the event itself. Any other attribute the
// policy names is read from the request header of that (lower-case) name.
const (
	attrAPIKey        = policy.APIKey
	attrRemoteAddress = engine.RemoteAddress
	attrForwardedFor  = engine.ForwardedFor
	attrMethod        = "method"
	attrPath          = "path"
	attrStage         = "stage"
)

// anonymous is the principalId of a request without an API key, token or address.
const anonymous = "anonymous"

// builtin are the attributes that never come from a header of the same name.
var builtin = map[string]bool{attrAPIKey: true, attrRemoteAddress: true, attrMethod: true, attrPath: true, attrStage: true}

// A shape is one of the event formats the authorizer answers.
type shape int

const (
	restRequest shape = iota + 1 // REST API REQUEST authorizer (and HTTP API payload 1.0)
	restToken                    // REST API TOKEN authorizer
	httpV2                       // HTTP API payload 2.0 authorizer, simple response
)

func (s shape) String() string {
	switch s {
	case restRequest:
		return "REST REQUEST"
	case restToken:
		return "REST TOKEN"
	case httpV2:
		return "HTTP API 2.0"
	}
	return "unknown"
}

// ErrBadEvent wraps every error about an event the authorizer cannot answer.
var ErrBadEvent = errors.New("bad event")

// A request is what the authorizer takes from an event.
type request struct {
	shape shape
	// arn is the methodArn (REST) or routeArn (HTTP API) the policy is for.
	arn string
	// attrs are the request's attributes; absent ones are left out, never empty.
	attrs map[string]string
	// identity reports whether the request carries an API key or token.
	identity bool
	// principal is the principalId: the hashed API key or token, else "anonymous"
	// (the handler puts the client's address in its place when it has one). It never
	// holds a raw secret.
	principal string
	// usageKey is the raw API key or token, for usageIdentifierKey. Never log it.
	usageKey string
	// keyHashed reports that attrs' api_key is the key's hash (algo.HashValue), made
	// here: a token always, an API key longer than the engine accepts.
	keyHashed bool
}

// probe holds the fields that tell the event shapes apart.
type probe struct {
	Type           string          `json:"type"`
	Version        string          `json:"version"`
	MethodArn      string          `json:"methodArn"`
	RouteArn       string          `json:"routeArn"`
	RequestContext json.RawMessage `json:"requestContext"`
}

// extractor turns events into requests for one policy.
type extractor struct {
	pol *policy.Policy // the policy it extracts for
	// forwarded reports that the policy trusts proxies, so the engine needs
	// X-Forwarded-For to identify the client.
	forwarded bool
	// headers are the policy's header attributes, lower-case.
	headers map[string]bool
}

func newExtractor(p *policy.Policy) *extractor {
	x := &extractor{pol: p, forwarded: p.Identity.TrustedProxies > 0, headers: map[string]bool{}}
	for _, a := range p.Attributes() {
		if !builtin[a] {
			x.headers[a] = true
		}
	}
	return x
}

// decode tells the event's shape from its fields and extracts the request. Every
// error wraps ErrBadEvent and says what is wrong with which field.
func (x extractor) decode(raw []byte) (request, error) {
	if len(raw) > MaxEventBytes {
		return request{}, fmt.Errorf("%w: the event is %d bytes; an API Gateway authorizer event is at most %d", ErrBadEvent, len(raw), MaxEventBytes)
	}
	trimmed := bytes.TrimSpace(raw)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		return request{}, fmt.Errorf("%w: the event is not a JSON object; want an API Gateway authorizer event", ErrBadEvent)
	}
	var p probe
	if err := json.Unmarshal(raw, &p); err != nil {
		return request{}, fmt.Errorf("%w: %s", ErrBadEvent, jsonProblem(err))
	}
	typ := strings.ToUpper(p.Type)
	switch {
	case p.RouteArn != "" || p.Version == "2.0" && typ == "REQUEST":
		var ev events.APIGatewayV2CustomAuthorizerV2Request
		if err := json.Unmarshal(raw, &ev); err != nil {
			return request{}, fmt.Errorf("%w: HTTP API 2.0 authorizer event: %s", ErrBadEvent, jsonProblem(err))
		}
		return x.fromHTTPV2(ev)
	case typ == "TOKEN":
		var ev events.APIGatewayCustomAuthorizerRequest
		if err := json.Unmarshal(raw, &ev); err != nil {
			return request{}, fmt.Errorf("%w: REST TOKEN authorizer event: %s", ErrBadEvent, jsonProblem(err))
		}
		return x.fromToken(ev)
	case typ == "REQUEST":
		var ev events.APIGatewayCustomAuthorizerRequestTypeRequest
		if err := json.Unmarshal(raw, &ev); err != nil {
			return request{}, fmt.Errorf("%w: REST REQUEST authorizer event: %s", ErrBadEvent, jsonProblem(err))
		}
		return x.fromRESTRequest(ev)
	case p.Type == "" && p.Version == "2.0" && len(p.RequestContext) > 0:
		return request{}, fmt.Errorf("%w: this is a Function URL (or HTTP API proxy) event, not an authorizer event; send it to the decision service (lambda/limiter)", ErrBadEvent)
	case p.Type != "":
		return request{}, fmt.Errorf("%w: type %q: want TOKEN or REQUEST", ErrBadEvent, clipped(p.Type))
	default:
		return request{}, fmt.Errorf("%w: no \"type\": want an API Gateway authorizer event (REST TOKEN or REQUEST, or HTTP API version 2.0 with a routeArn)", ErrBadEvent)
	}
}

func (x extractor) fromRESTRequest(ev events.APIGatewayCustomAuthorizerRequestTypeRequest) (request, error) {
	if ev.MethodArn == "" {
		return request{}, fmt.Errorf("%w: REST REQUEST authorizer event: methodArn is empty", ErrBadEvent)
	}
	r := request{shape: restRequest, arn: ev.MethodArn, attrs: map[string]string{}}
	h := x.scan(ev.Headers, r.attrs)
	key := ev.RequestContext.Identity.APIKey
	if key == "" {
		key = h.apiKey
	}
	if peer := ev.RequestContext.Identity.SourceIP; peer != "" {
		set(r.attrs, attrRemoteAddress, peer)
		if x.forwarded {
			set(r.attrs, attrForwardedFor, lastHops(h.xff))
		}
	}
	set(r.attrs, attrMethod, first(ev.HTTPMethod, ev.RequestContext.HTTPMethod))
	set(r.attrs, attrPath, first(ev.Resource, ev.RequestContext.ResourcePath, ev.Path))
	set(r.attrs, attrStage, ev.RequestContext.Stage)
	r.withKey(key)
	return r, nil
}

func (x extractor) fromToken(ev events.APIGatewayCustomAuthorizerRequest) (request, error) {
	if ev.MethodArn == "" {
		return request{}, fmt.Errorf("%w: REST TOKEN authorizer event: methodArn is empty", ErrBadEvent)
	}
	r := request{shape: restToken, arn: ev.MethodArn, attrs: map[string]string{}}
	// A TOKEN event has the token and the method ARN, nothing else: no client
	// address, no headers. The stage, method and path come from the ARN.
	if stage, method, path, ok := splitMethodArn(ev.MethodArn); ok {
		set(r.attrs, attrStage, stage)
		set(r.attrs, attrMethod, method)
		set(r.attrs, attrPath, path)
	}
	if tok := strings.TrimSpace(ev.AuthorizationToken); tok != "" {
		r.identity = true
		r.usageKey = ev.AuthorizationToken
		r.attrs[attrAPIKey] = algo.HashValue(tok)
		r.keyHashed = true
		r.principal = r.attrs[attrAPIKey]
	} else {
		r.principal = anonymous
	}
	return r, nil
}

func (x extractor) fromHTTPV2(ev events.APIGatewayV2CustomAuthorizerV2Request) (request, error) {
	if ev.RouteArn == "" {
		return request{}, fmt.Errorf("%w: HTTP API 2.0 authorizer event: routeArn is empty", ErrBadEvent)
	}
	r := request{shape: httpV2, arn: ev.RouteArn, attrs: map[string]string{}}
	h := x.scan(ev.Headers, r.attrs)
	if peer := ev.RequestContext.HTTP.SourceIP; peer != "" {
		set(r.attrs, attrRemoteAddress, peer)
		if x.forwarded {
			set(r.attrs, attrForwardedFor, lastHops(h.xff))
		}
	}
	set(r.attrs, attrMethod, ev.RequestContext.HTTP.Method)
	set(r.attrs, attrPath, routePath(first(ev.RouteKey, ev.RequestContext.RouteKey), first(ev.RawPath, ev.RequestContext.HTTP.Path)))
	set(r.attrs, attrStage, ev.RequestContext.Stage)
	r.withKey(h.apiKey)
	return r, nil
}

// withKey sets the API key attribute and the principal.
func (r *request) withKey(key string) {
	switch {
	case key != "":
		r.identity = true
		r.usageKey = key
		r.attrs[attrAPIKey] = fit(key)
		r.keyHashed = len(key) > bounds.MaxValueLength // fit hashed it
		r.principal = algo.HashValue(key)
	default:
		r.principal = anonymous
	}
}

// scanned are the headers the authorizer reads for itself.
type scanned struct {
	apiKey string
	xff    string
}

// scan reads the policy's header attributes into attrs (matching names without
// regard to case) and returns the API key and X-Forwarded-For headers.
func (x extractor) scan(headers map[string]string, attrs map[string]string) scanned {
	var s scanned
	for k, v := range headers {
		lk := strings.ToLower(k)
		switch lk {
		case "x-api-key":
			s.apiKey = strings.TrimSpace(v)
		case "x-forwarded-for":
			s.xff = v
		}
		if x.headers[lk] {
			set(attrs, lk, v)
		}
	}
	return s
}

// set sets attrs[k] to v unless v is empty: a policy rule matches an attribute that
// is present, so an empty value must not be.
func set(attrs map[string]string, k, v string) {
	if v = strings.TrimSpace(v); v != "" {
		attrs[k] = fit(v)
	}
}

// fit hashes a value longer than the engine accepts, so that an oversized header
// gives its sender a limit of its own instead of an error.
func fit(v string) string {
	if len(v) > bounds.MaxValueLength {
		return algo.HashValue(v)
	}
	return v
}

// lastHops returns X-Forwarded-For cut to the entries at its right end that fit in
// an attribute: the trusted entries are counted from the right (identity.Address), so
// a chain too long to pass whole keeps the ones that matter.
func lastHops(xff string) string {
	if len(xff) <= bounds.MaxValueLength {
		return xff
	}
	tail := xff[len(xff)-bounds.MaxValueLength:]
	if i := strings.IndexByte(tail, ','); i >= 0 {
		return tail[i+1:]
	}
	return tail
}

func first(vs ...string) string {
	for _, v := range vs {
		if v != "" {
			return v
		}
	}
	return ""
}

// splitMethodArn splits arn:aws:execute-api:REGION:ACCOUNT:API/STAGE/VERB/PATH into
// the stage, the verb and "/PATH".
func splitMethodArn(arn string) (stage, method, path string, ok bool) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[2] != "execute-api" {
		return "", "", "", false
	}
	res := strings.SplitN(parts[5], "/", 4)
	if len(res) < 3 {
		return "", "", "", false
	}
	path = "/"
	if len(res) == 4 {
		path += res[3]
	}
	return res[1], res[2], path, true
}

// routePath returns the path template of an HTTP API route key ("GET /pets/{id}" →
// "/pets/{id}"), or rawPath for the $default route.
func routePath(routeKey, rawPath string) string {
	if _, p, ok := strings.Cut(routeKey, " "); ok && strings.HasPrefix(p, "/") {
		return p
	}
	return rawPath
}

// jsonProblem rewords a decoding error so that it names the field.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := te.Field
		if field == "" {
			field = "(the event)"
		}
		return fmt.Sprintf("field %s: got a JSON %s, want %s", field, te.Value, te.Type)
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("not valid JSON at byte %d: %v", se.Offset, se)
	}
	return err.Error()
}

// clipped shortens a value quoted in an error.
func clipped(s string) string {
	const n = 64
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
