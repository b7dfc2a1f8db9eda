package main

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/wasmfilter/internal/jsonv"
)

// Defaults and bounds of the plugin configuration.
const (
	defaultPath    = "/v1/check"
	defaultTimeout = 100 * time.Millisecond
	maxTimeout     = 60 * time.Second
	// defaultMaxAttributeBytes is at most bounds.MaxValueLength: past the decision
	// service's bounds (package bounds, shared with it) it answers 400, and the filter
	// would take its failure mode for every request.
	defaultMaxAttributeBytes = 256
	defaultDenyCacheEntries  = 10000
	maxDenyCacheEntries      = 1000000
	defaultLocalMaxKeys      = 10000
	maxLocalMaxKeys          = 1000000
	defaultMaxDelay          = 10 * time.Second
	maxMaxDelay              = 10 * time.Minute
	defaultTick              = 10 * time.Millisecond
	maxTick                  = time.Second
	defaultMaxHeld           = 1000
	maxMaxHeld               = 100000
	// maxConfigBytes bounds the plugin configuration: a real one is a few hundred
	// bytes (64 attributes and 64 local limits fit in 16 KiB), and a larger one is a
	// mistake, not something to parse inside every worker's VM.
	maxConfigBytes = 256 << 10
	// maxLocalLimits bounds local_limits: every request is checked against each.
	maxLocalLimits = 64

	defaultSettleAttempts = 3
	maxSettleAttempts     = 10
	defaultSettleRetry    = 200 * time.Millisecond
	maxSettleRetry        = time.Minute
	defaultSettlePending  = 10000
	maxSettlePending      = 1000000
	// maxReserveTTL is the decision service's longest reserve_ttl_ms (an hour).
	maxReserveTTL = time.Hour
)

// A source says where an attribute's value comes from.
type source string

// The attribute sources.
const (
	fromHeader        source = "header"          // a request header, named by attribute.header
	fromSourceAddress source = "source.address"  // the client address, without its port
	fromPath          source = "path"            // :path without the query string
	fromPathWithQuery source = "path_with_query" // :path as received
	fromMethod        source = "method"          // :method
)

// A failureMode says what the filter does when the decision callout fails.
type failureMode string

// The failure modes.
const (
	failOpen   failureMode = "open"   // let the request through
	failClosed failureMode = "closed" // answer 503
	failLocal  failureMode = "local"  // decide with the local limits
)

// An oversizePolicy says what happens to an attribute value longer than
// maxAttributeBytes.
type oversizePolicy string

// The oversize policies.
const (
	oversizeTruncate oversizePolicy = "truncate" // cut it to the limit (at a UTF-8 boundary)
	oversizeReject   oversizePolicy = "reject"   // answer 400 without a callout
)

// An attribute is one request attribute sent to the decision service.
type attribute struct {
	name   string
	from   source
	header string // lower-case header name, for fromHeader
}

// A localLimit is a limit the filter decides in its own VM when the callout fails and
// failure_mode is "local". It applies to requests that carry every attribute of key;
// each distinct combination of their values gets its own meter.
type localLimit struct {
	name  string
	key   []string
	meter algo.Meter
}

// A config is the parsed plugin configuration. The zero value is not valid; build it
// with parseConfig.
type config struct {
	cluster   string
	authority string
	path      string
	timeout   time.Duration
	domain    string
	cost      int64

	attributes        []attribute
	maxAttributeBytes int
	oversize          oversizePolicy

	failureMode  failureMode
	localLimits  []localLimit
	localMaxKeys int

	denyCache        bool
	denyCacheEntries int
	// denyCacheKey names the attributes that identify a client in the deny cache;
	// empty means every attribute.
	denyCacheKey []string

	maxDelay time.Duration
	tick     time.Duration
	maxHeld  int

	// settle, when not nil, charges each response's cost after the fact.
	settle *settleConfig
}

// A settleConfig says how the cost of a response, known only once the upstream has
// answered (an LLM's tokens), is settled with the decision service after the stream.
type settleConfig struct {
	// costHeader and costTrailer name the response header and trailer that carry
	// the cost (lower-case; at least one is set). The trailer wins when both come.
	costHeader, costTrailer string
	// estimate, when not 0, is reserved in the request phase (instead of cost) and
	// the settlement gives back or charges the difference.
	estimate int64
	// reserveTTL is how long the service keeps a reservation (0: its default).
	reserveTTL time.Duration
	// maxAttempts bounds the callouts of one settlement; retry is the wait between.
	maxAttempts int
	retry       time.Duration
	// maxPending bounds the settlements waiting or in flight per VM.
	maxPending int
}

// A configError is an invalid plugin configuration; Field is the JSON path at fault.
type configError struct {
	Field string
	Msg   string
}

func (e *configError) Error() string {
	if e.Field == "" {
		return "invalid plugin configuration: " + e.Msg
	}
	return "invalid plugin configuration: " + e.Field + ": " + e.Msg
}

// defaultAttributes is the attribute set of a configuration that names none.
var defaultAttributes = []attribute{
	{name: "remote_address", from: fromSourceAddress},
	{name: "path", from: fromPath},
	{name: "method", from: fromMethod},
}

var topLevelFields = []string{
	"cluster", "authority", "path", "timeout_ms", "domain", "cost",
	"attributes", "max_attribute_bytes", "oversize",
	"failure_mode", "local_limits", "local_max_keys",
	"deny_cache", "max_delay_ms", "tick_ms", "max_held_requests", "settle",
}

var settleFields = []string{"cost_header", "cost_trailer", "estimate", "reserve_ttl_ms", "max_attempts", "retry_ms", "max_pending"}

// parseConfig parses and validates the plugin configuration, a JSON object. It returns
// a *configError naming the first field at fault.
func parseConfig(data []byte) (*config, error) {
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, &configError{Msg: `the configuration is empty; set at least "cluster" and "domain"`}
	}
	if len(data) > maxConfigBytes {
		return nil, &configError{Msg: "the configuration is " + strconv.Itoa(len(data)) + " bytes, over the limit of " + strconv.Itoa(maxConfigBytes) + "; a tollgate configuration needs a few hundred"}
	}
	root, err := jsonv.Parse(data)
	if err != nil {
		return nil, jsonError(err)
	}
	if root.Kind() != jsonv.Object {
		return nil, &configError{Msg: "the configuration must be a JSON object"}
	}
	if err := knownFields(root, "", topLevelFields); err != nil {
		return nil, err
	}
	c := &config{}
	if c.cluster, err = str(root, "cluster", "", true); err != nil {
		return nil, err
	}
	if c.authority, err = str(root, "authority", c.cluster, false); err != nil {
		return nil, err
	}
	if c.path, err = str(root, "path", defaultPath, false); err != nil {
		return nil, err
	}
	if !strings.HasPrefix(c.path, "/") {
		return nil, &configError{"path", "must start with /, e.g. " + strconv.Quote(defaultPath)}
	}
	if c.timeout, err = millis(root, "timeout_ms", defaultTimeout, time.Millisecond, maxTimeout); err != nil {
		return nil, err
	}
	if c.domain, err = str(root, "domain", "", true); err != nil {
		return nil, err
	}
	// The requests the filter sends are within the decision service's bounds (package
	// bounds) by construction, checked here once: at most bounds.MaxAttributes
	// attributes (parseAttributes), named in at most 64 ASCII characters (validName),
	// values cut or refused at max_attribute_bytes (at most bounds.MaxValueLength) and
	// JSON-escaped to valid UTF-8, and a cost of at most bounds.MaxCost.
	if c.cost, err = integer(root, "cost", 1, 0, bounds.MaxCost); err != nil {
		return nil, err
	}
	if c.attributes, err = parseAttributes(root); err != nil {
		return nil, err
	}
	n, err := integer(root, "max_attribute_bytes", defaultMaxAttributeBytes, 1, bounds.MaxValueLength)
	if err != nil {
		return nil, err
	}
	c.maxAttributeBytes = int(n)
	o, err := enum(root, "oversize", string(oversizeTruncate), string(oversizeTruncate), string(oversizeReject))
	if err != nil {
		return nil, err
	}
	c.oversize = oversizePolicy(o)
	m, err := enum(root, "failure_mode", string(failOpen), string(failOpen), string(failClosed), string(failLocal))
	if err != nil {
		return nil, err
	}
	c.failureMode = failureMode(m)
	if c.localLimits, err = parseLocalLimits(root, c.attributes); err != nil {
		return nil, err
	}
	if c.failureMode == failLocal && len(c.localLimits) == 0 {
		return nil, &configError{"local_limits", `failure_mode "local" needs at least one local limit, e.g. [{"name": "per-key", "key": ["api_key"], "rate": "100/min"}]`}
	}
	if n, err = integer(root, "local_max_keys", defaultLocalMaxKeys, 1, maxLocalMaxKeys); err != nil {
		return nil, err
	}
	c.localMaxKeys = int(n)
	if err = parseDenyCache(root, c); err != nil {
		return nil, err
	}
	if c.maxDelay, err = millis(root, "max_delay_ms", defaultMaxDelay, 0, maxMaxDelay); err != nil {
		return nil, err
	}
	if c.tick, err = millis(root, "tick_ms", defaultTick, time.Millisecond, maxTick); err != nil {
		return nil, err
	}
	if n, err = integer(root, "max_held_requests", defaultMaxHeld, 0, maxMaxHeld); err != nil {
		return nil, err
	}
	c.maxHeld = int(n)
	if c.settle, err = parseSettle(root); err != nil {
		return nil, err
	}
	return c, nil
}

// parseSettle reads the optional settle block.
func parseSettle(root jsonv.Value) (*settleConfig, error) {
	v, ok := root.Get("settle")
	if !ok {
		return nil, nil
	}
	if v.Kind() != jsonv.Object {
		return nil, &configError{"settle", `must be an object such as {"cost_header": "x-tokens-used"}`}
	}
	if err := knownFields(v, "settle.", settleFields); err != nil {
		return nil, err
	}
	s := &settleConfig{}
	var err error
	for _, f := range []struct {
		name string
		dst  *string
	}{{"cost_header", &s.costHeader}, {"cost_trailer", &s.costTrailer}} {
		if *f.dst, err = str(v, f.name, "", false); err != nil {
			return nil, prefixed("settle", err)
		}
		if *f.dst != "" && !headerToken(*f.dst) {
			return nil, &configError{"settle." + f.name, strconv.Quote(*f.dst) + ` is not a header name; name the response's own, e.g. "x-tokens-used"`}
		}
		*f.dst = strings.ToLower(*f.dst)
	}
	if s.costHeader == "" && s.costTrailer == "" {
		return nil, &configError{"settle.cost_header", `settle needs the cost's response header or trailer: set cost_header (e.g. "x-tokens-used") or cost_trailer, or both`}
	}
	if s.estimate, err = integer(v, "estimate", 0, 1, bounds.MaxCost); err != nil {
		return nil, prefixed("settle", err)
	}
	if _, ok := v.Get("estimate"); ok {
		if _, set := root.Get("cost"); set {
			return nil, &configError{"settle.estimate", "is the request's cost when it reserves, so it replaces cost: remove cost, or remove estimate to check with cost and settle the whole response"}
		}
	}
	if s.reserveTTL, err = millis(v, "reserve_ttl_ms", 0, time.Millisecond, maxReserveTTL); err != nil {
		return nil, prefixed("settle", err)
	}
	if _, ok := v.Get("reserve_ttl_ms"); ok && s.estimate == 0 {
		return nil, &configError{"settle.reserve_ttl_ms", "applies to a reservation: set estimate too, or remove reserve_ttl_ms"}
	}
	n, err := integer(v, "max_attempts", defaultSettleAttempts, 1, maxSettleAttempts)
	if err != nil {
		return nil, prefixed("settle", err)
	}
	s.maxAttempts = int(n)
	if s.retry, err = millis(v, "retry_ms", defaultSettleRetry, time.Millisecond, maxSettleRetry); err != nil {
		return nil, prefixed("settle", err)
	}
	if n, err = integer(v, "max_pending", defaultSettlePending, 1, maxSettlePending); err != nil {
		return nil, prefixed("settle", err)
	}
	s.maxPending = int(n)
	return s, nil
}

// jsonError describes a configuration that jsonv cannot read.
func jsonError(err error) error {
	var je *jsonv.Error
	switch {
	case !errors.As(err, &je):
		return &configError{Msg: "the configuration is not valid JSON: " + err.Error()}
	case errors.Is(err, jsonv.ErrDuplicateKey) && je.Path != "":
		return &configError{je.Path, "is set twice; keep one of them"}
	case errors.Is(err, jsonv.ErrTooDeep):
		return &configError{topField(je.Path), "is nested too deeply: arrays and objects nest at most " + strconv.Itoa(jsonv.MaxDepth) +
			" deep, and a tollgate configuration needs 3 (" + strings.TrimPrefix(err.Error(), "jsonv: ") + ")"}
	default:
		return &configError{Msg: "the configuration is not valid JSON: " + strings.TrimPrefix(err.Error(), "jsonv: ")}
	}
}

// topField returns the top-level member of a jsonv path ("local_limits" of
// "local_limits[0].key[1]"), to name the field at fault without a path as long as
// the nesting.
func topField(path string) string {
	if i := strings.IndexAny(path, ".["); i > 0 {
		return path[:i]
	}
	return path
}

func parseAttributes(root jsonv.Value) ([]attribute, error) {
	v, ok := root.Get("attributes")
	if !ok {
		return defaultAttributes, nil
	}
	if v.Kind() != jsonv.Array {
		return nil, &configError{"attributes", `must be an array of objects such as {"name": "api_key", "from": "header", "header": "x-api-key"}`}
	}
	items := v.Elems()
	if len(items) == 0 {
		return nil, &configError{"attributes", "must name at least one attribute"}
	}
	if len(items) > bounds.MaxAttributes {
		return nil, &configError{"attributes", strconv.Itoa(len(items)) + " attributes; the decision service takes at most " + strconv.Itoa(bounds.MaxAttributes)}
	}
	attrs := make([]attribute, 0, len(items))
	seen := make(map[string]bool, len(items))
	for i, item := range items {
		field := "attributes[" + strconv.Itoa(i) + "]"
		if item.Kind() != jsonv.Object {
			return nil, &configError{field, "must be an object with name and from"}
		}
		if err := knownFields(item, field+".", []string{"name", "from", "header"}); err != nil {
			return nil, err
		}
		name, err := uniqueName(item, field, seen)
		if err != nil {
			return nil, err
		}
		from, err := enum(item, "from", "", string(fromHeader), string(fromSourceAddress), string(fromPath), string(fromPathWithQuery), string(fromMethod))
		if err != nil {
			return nil, prefixed(field, err)
		}
		a := attribute{name: name, from: source(from)}
		header, err := str(item, "header", "", false)
		if err != nil {
			return nil, prefixed(field, err)
		}
		switch {
		case a.from == fromHeader && header == "":
			return nil, &configError{field + ".header", `from "header" needs the header's name, e.g. "x-api-key"`}
		case a.from != fromHeader && header != "":
			return nil, &configError{field + ".header", `only from "header" takes a header name; remove it`}
		case strings.HasPrefix(header, ":"):
			return nil, &configError{field + ".header", `pseudo-headers come from "path", "path_with_query" or "method"`}
		}
		a.header = strings.ToLower(header)
		attrs = append(attrs, a)
	}
	return attrs, nil
}

// uniqueName reads the required name of the list item at field, checks its form,
// and that no earlier item of the list (seen) has it.
func uniqueName(item jsonv.Value, field string, seen map[string]bool) (string, error) {
	name, err := str(item, "name", "", true)
	if err != nil {
		return "", prefixed(field, err)
	}
	if !validName(name) {
		return "", &configError{field + ".name", strconv.Quote(name) + " must be 1 to 64 characters of a-z, 0-9, _, - and ."}
	}
	if seen[name] {
		return "", &configError{field + ".name", strconv.Quote(name) + " is named twice"}
	}
	seen[name] = true
	return name, nil
}

func parseLocalLimits(root jsonv.Value, attrs []attribute) ([]localLimit, error) {
	v, ok := root.Get("local_limits")
	if !ok {
		return nil, nil
	}
	if v.Kind() != jsonv.Array {
		return nil, &configError{"local_limits", `must be an array such as [{"name": "per-key", "key": ["api_key"], "rate": "100/min"}]`}
	}
	if n := len(v.Elems()); n > maxLocalLimits {
		return nil, &configError{"local_limits", strconv.Itoa(n) + " limits, over the limit of " + strconv.Itoa(maxLocalLimits) + " (every request is checked against each); merge limits that share a key"}
	}
	var limits []localLimit
	seen := map[string]bool{}
	for i, item := range v.Elems() {
		field := "local_limits[" + strconv.Itoa(i) + "]"
		if item.Kind() != jsonv.Object {
			return nil, &configError{field, "must be an object with name, key and rate"}
		}
		if err := knownFields(item, field+".", []string{"name", "key", "algorithm", "rate", "burst"}); err != nil {
			return nil, err
		}
		name, err := uniqueName(item, field, seen)
		if err != nil {
			return nil, err
		}
		var key []string
		if k, ok := item.Get("key"); ok {
			if key, err = attributeNames(k, field+".key", attrs); err != nil {
				return nil, err
			}
		}
		alg, err := str(item, "algorithm", string(algo.GCRA), false)
		if err != nil {
			return nil, prefixed(field, err)
		}
		rate, err := str(item, "rate", "", true)
		if err != nil {
			return nil, prefixed(field, err)
		}
		count, period, err := algo.ParseRate(rate)
		if err != nil {
			return nil, &configError{field + ".rate", fieldMsg(err)}
		}
		burst, err := integer(item, "burst", 0, 0, algo.MaxCount)
		if err != nil {
			return nil, prefixed(field, err)
		}
		l := algo.Limit{Algorithm: algo.Algorithm(alg), Count: count, Period: period, Burst: burst}
		if err := l.Validate(); err != nil {
			return nil, &configError{field + "." + fieldOf(err, "rate"), fieldMsg(err)}
		}
		limits = append(limits, localLimit{name: name, key: key, meter: algo.Meter{Limits: []algo.Limit{l}}})
	}
	return limits, nil
}

func parseDenyCache(root jsonv.Value, c *config) error {
	c.denyCache = true
	c.denyCacheEntries = defaultDenyCacheEntries
	v, ok := root.Get("deny_cache")
	if !ok {
		return nil
	}
	if v.Kind() != jsonv.Object {
		return &configError{"deny_cache", `must be an object such as {"enabled": true, "max_entries": 10000, "key": ["api_key"]}`}
	}
	if err := knownFields(v, "deny_cache.", []string{"enabled", "max_entries", "key"}); err != nil {
		return err
	}
	if e, ok := v.Get("enabled"); ok {
		if c.denyCache, ok = e.Bool(); !ok {
			return &configError{"deny_cache.enabled", "must be true or false"}
		}
	}
	n, err := integer(v, "max_entries", defaultDenyCacheEntries, 1, maxDenyCacheEntries)
	if err != nil {
		return prefixed("deny_cache", err)
	}
	c.denyCacheEntries = int(n)
	if k, ok := v.Get("key"); ok {
		if c.denyCacheKey, err = attributeNames(k, "deny_cache.key", c.attributes); err != nil {
			return err
		}
		if len(c.denyCacheKey) == 0 {
			return &configError{"deny_cache.key", "must name at least one attribute (leave it out to use every attribute)"}
		}
	}
	return nil
}

// attributeNames parses an array of attribute names, each of which must be configured.
func attributeNames(v jsonv.Value, field string, attrs []attribute) ([]string, error) {
	if v.Kind() != jsonv.Array {
		return nil, &configError{field, `must be an array of attribute names, e.g. ["api_key"]`}
	}
	var names []string
	for i, n := range v.Elems() {
		f := field + "[" + strconv.Itoa(i) + "]"
		name, ok := n.Str()
		if !ok {
			return nil, &configError{f, "must be a string"}
		}
		if !hasAttribute(attrs, name) {
			return nil, &configError{f, strconv.Quote(name) + " is not one of the configured attributes"}
		}
		for _, prev := range names {
			if prev == name {
				return nil, &configError{f, strconv.Quote(name) + " is named twice"}
			}
		}
		names = append(names, name)
	}
	return names, nil
}

func hasAttribute(attrs []attribute, name string) bool {
	for _, a := range attrs {
		if a.name == name {
			return true
		}
	}
	return false
}

// knownFields rejects any key of obj that is not in known, so that a misspelt option
// fails plugin start instead of being ignored.
func knownFields(obj jsonv.Value, prefix string, known []string) error {
	for _, m := range obj.Members() {
		if !slices.Contains(known, m.Key) {
			return &configError{prefix + m.Key, "unknown field; known fields are " + strings.Join(known, ", ")}
		}
	}
	return nil
}

func str(obj jsonv.Value, field, def string, required bool) (string, error) {
	v, ok := obj.Get(field)
	if !ok {
		if required {
			return "", &configError{field, "is required"}
		}
		return def, nil
	}
	s, ok := v.Str()
	if !ok {
		return "", &configError{field, "must be a string"}
	}
	if s == "" {
		return "", &configError{field, "must not be empty"}
	}
	return s, nil
}

func enum(obj jsonv.Value, field, def string, values ...string) (string, error) {
	s, err := str(obj, field, def, def == "")
	if err != nil {
		return "", err
	}
	for _, v := range values {
		if s == v {
			return s, nil
		}
	}
	return "", &configError{field, strconv.Quote(s) + " is not one of " + strings.Join(values, ", ")}
}

func integer(obj jsonv.Value, field string, def, lo, hi int64) (int64, error) {
	v, ok := obj.Get(field)
	if !ok {
		return def, nil
	}
	text, ok := v.Num()
	if !ok {
		return 0, &configError{field, "must be a whole number"}
	}
	if strings.ContainsAny(text, ".eE") {
		return 0, &configError{field, text + " is not a whole number"}
	}
	// An integer that does not fit an int64 is out of range too.
	if n, ok := v.Int(); ok && n >= lo && n <= hi {
		return n, nil
	}
	return 0, &configError{field, "must be from " + strconv.FormatInt(lo, 10) + " to " + strconv.FormatInt(hi, 10)}
}

func millis(obj jsonv.Value, field string, def, lo, hi time.Duration) (time.Duration, error) {
	n, err := integer(obj, field, int64(def/time.Millisecond), int64(lo/time.Millisecond), int64(hi/time.Millisecond))
	return time.Duration(n) * time.Millisecond, err
}

// prefixed puts the path of the enclosing object in front of err's field.
func prefixed(prefix string, err error) error {
	if ce, ok := err.(*configError); ok {
		return &configError{prefix + "." + ce.Field, ce.Msg}
	}
	return err
}

// fieldOf returns the field named by the first *algo.FieldError in err, or def.
func fieldOf(err error, def string) string {
	if fe := firstFieldError(err); fe != nil {
		return fe.Field
	}
	return def
}

// fieldMsg returns the message of the first *algo.FieldError in err, or err's text.
func fieldMsg(err error) string {
	if fe := firstFieldError(err); fe != nil {
		if fe.Value != "" {
			return strconv.Quote(fe.Value) + ": " + fe.Msg
		}
		return fe.Msg
	}
	return err.Error()
}

func firstFieldError(err error) *algo.FieldError {
	switch e := err.(type) {
	case *algo.FieldError:
		return e
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if fe := firstFieldError(inner); fe != nil {
				return fe
			}
		}
	case interface{ Unwrap() error }:
		return firstFieldError(e.Unwrap())
	}
	return nil
}

// validName reports whether s is a usable attribute or limit name.
func validName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// headerToken reports whether s is an HTTP field name (RFC 9110's token), which rules
// out pseudo-headers such as ":status".
func headerToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return s != ""
}
