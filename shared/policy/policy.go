// Package policy parses and validates tollgate policies and maps a request's attributes
// to the meters it must pass.
//
// A policy is a YAML document (or the same structure in JSON) that names a domain, the
// failure policy, and an ordered list of rules. A rule matches on request attributes —
// an exact value, or "*" for one limit per distinct value — and carries one or more
// limits of the algorithms of package algo. Parse checks the whole document and reports
// every problem at once, each with its path (rules[2].limits[0].rate) and a fix.
//
// A parsed *Policy is immutable and safe for simultaneous use.
package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/big"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/identity"
)

// MaxSize is the largest policy Parse and Load accept, in bytes.
const MaxSize = 1 << 20

// Defaults of the optional fields.
const (
	DefaultPrefix            = "tg:"
	DefaultTimeout           = 50 * time.Millisecond
	DefaultBreakerFailures   = 5
	DefaultBreakerOpenFor    = 5 * time.Second
	DefaultIPv6Prefix        = identity.DefaultIPv6Prefix
	DefaultDenyCacheEntries  = 100000
	DefaultExpectedInstances = 1
)

// Bounds of the numeric fields, inclusive.
const (
	MinTimeout        = time.Millisecond
	MaxTimeout        = 10 * time.Second
	MaxInstances      = 10000
	MaxBreakerFailure = 1000000
	MinOpenFor        = time.Millisecond
	MaxOpenFor        = time.Hour
	MaxTrustedProxies = 32
	MaxDenyCache      = 10000000
	MaxPrefixLen      = 64
)

// A FailureMode says how requests are decided while the store (Redis) is unreachable.
type FailureMode string

// The failure modes.
const (
	// FailOpen admits every request while the store is down.
	FailOpen FailureMode = "open"
	// FailClosed denies every request while the store is down.
	FailClosed FailureMode = "closed"
	// FailLocal decides in process, each limit divided by Failure.ExpectedInstances
	// (see Scale).
	FailLocal FailureMode = "local"
)

// Failure is the failure policy: what to do when the store fails or is slow.
type Failure struct {
	// Mode is open, closed or local. Default open.
	Mode FailureMode
	// Timeout bounds one decision, store round trip included. Default 50ms; 1ms to 10s.
	Timeout time.Duration
	// ExpectedInstances is the number of processes that share the traffic; local mode
	// divides each limit by it. Default 1.
	ExpectedInstances int
	// Breaker is the circuit breaker in front of the store.
	Breaker Breaker
}

// Breaker configures the circuit breakers, one per Redis node: after Failures
// consecutive failures a node's breaker opens and requests for its keys skip it
// (following Failure.Mode). It lets one probe through 200ms later (or after OpenFor, if
// shorter); each failed probe doubles the wait, up to OpenFor, and a successful one
// closes it.
type Breaker struct {
	Failures int           // default 5
	OpenFor  time.Duration // the longest wait between probes; default 5s
}

// Identity says how a client's address is derived (see identity.Address).
type Identity = identity.Options

// DenyCache configures the in-process cache of denied keys, which answers repeated
// requests of a denied client without a store round trip until the key resets.
type DenyCache struct {
	Enabled    bool // default true
	MaxEntries int  // default 100000
}

// DefaultPlanAttribute is the attribute Plans fills unless it names another.
const DefaultPlanAttribute = "plan"

// Plans maps API keys to plans, so that rules can choose limits by plan
// (match: {plan: pro}). The table holds keys as they are or, so that the policy
// holds no secret, as "sha256:" and the hex SHA-256 of the key.
type Plans struct {
	// Attribute is the attribute the plan goes in (default "plan"). A value the
	// request carries for it is replaced: only the table says a key's plan.
	Attribute string
	// From is the attribute holding the key (default api_key). A value a front
	// door hashed ("~" and the hex SHA-256, see algo.HashValue) is looked up by its
	// hash when the front door says so (Plan's hashed).
	From string
	// Default is the plan of a key the table lacks; empty leaves such requests
	// without the plan attribute.
	Default string
	// Keys maps keys, or "sha256:HEX", to plans.
	Keys map[string]string
}

// Plan returns the plan of a request whose key attribute is key, or "". hashed says
// that a front door put the key's hash in the attribute ("~" and the hex SHA-256, as
// algo.HashValue writes it); otherwise the value is the client's as sent, so a client
// that sends a table entry's hash, in either form, gets no plan by it: the hash in
// the policy is not a secret.
func (pl *Plans) Plan(key string, hashed bool) string {
	if plan, ok := pl.Keys[key]; ok && !strings.HasPrefix(key, "sha256:") {
		return plan
	}
	hexSum, pre := strings.CutPrefix(key, "~")
	if !hashed || !pre || len(hexSum) != 64 {
		sum := sha256.Sum256([]byte(key))
		hexSum = hex.EncodeToString(sum[:])
	}
	if plan, ok := pl.Keys["sha256:"+hexSum]; ok {
		return plan
	}
	return pl.Default
}

// A Policy is a parsed, valid policy. Build it with Parse or Load; it must not be
// modified afterwards.
type Policy struct {
	// Domain names the policy; requests carry the domain they are decided in.
	Domain string
	// Prefix starts every store key. Default "tg:".
	Prefix string
	// ShardBy names the attribute whose value is the Redis Cluster hash tag of the
	// keys of every rule that matches on it, so one client's limits share one slot.
	// Empty for none.
	ShardBy   string
	Failure   Failure
	Identity  Identity
	DenyCache DenyCache
	// Plans, if set, fills a plan attribute from a table of API keys.
	Plans *Plans
	// Rules in the order of the policy file, which is the order of Match's results.
	Rules []*Rule

	attributes []string // sorted names of every attribute matched or recorded
}

// A Rule maps requests that match it to its limits.
type Rule struct {
	// Name is unique in the policy and appears in keys and headers:
	// ^[a-z0-9][a-z0-9_.-]{0,62}$.
	Name string
	// Match maps attribute names to what the rule wants of them (see Matcher). An
	// empty Match applies to every request.
	Match map[string]*Matcher
	// Shadow rules are decided and reported but never deny.
	Shadow bool
	// Settle rules charge costs already spent (an LLM response's tokens, sent by a
	// response-phase call): a request they match is settled, charged and never
	// refused, and may leave their limits in debt (engine.Engine.Settle). Their
	// limits cannot be sliding_log nor leased.
	Settle bool
	// Unlimited rules limit nothing: a request they match is admitted by them (an
	// allow list), and with Replaces they lift other rules' limits.
	Unlimited bool
	// Replaces names rules this rule takes the place of: when this rule applies to
	// a request, the rules it replaces do not (a customer's own limit instead of the
	// default one). A rule cannot replace itself, and rules cannot replace each other
	// in a cycle.
	Replaces []string
	// RLQS, when set, serves the rule's limits to Envoy's rate limit quota filter
	// (package rlqs); nil for a rule that is not.
	RLQS *RLQS
	// Limits as written in the policy, in its order.
	Limits []RuleLimit
	// Meters are the compiled limits, one store key each: the rule's bucket_ring limits
	// form one meter (at the place of the first of them), every other limit its own.
	Meters []RuleMeter

	attrs      []string // names in Match, sorted
	sharded    bool     // Match names the policy's ShardBy attribute
	replacedBy []*Rule  // the rules whose Replaces name this one
}

// A RuleLimit is one limit of a rule as the policy states it: the limit and what is
// written beside it.
type RuleLimit struct {
	algo.Limit
	// Lease is the lease the limit is served from (see Lease); the zero Lease for none.
	Lease Lease
	// Record names the attribute whose value is kept with each admitted request, or ""
	// for none.
	Record string
	// Replicas are the replicas the limit's charges must reach before the decision is
	// answered (algo.Replicas; the policy's replicas field); the zero value for none.
	Replicas algo.Replicas
	// Counter names the counter whose state the limit shares with the limits of other
	// rules that name it (the policy's counter field), or "" for the limit's own.
	Counter string
}

// A RuleMeter is one compiled meter of a rule: one store key, deciding one limit or
// the rule's bucket_ring limits together.
type RuleMeter struct {
	// Meter is what the store decides. Its Record is empty; Match fills it from the
	// request.
	Meter algo.Meter
	// ID names the meter in its key (algo.MeterID).
	ID string
	// Lease is the lease the meter is served from; the zero Lease for none (always
	// for a bucket_ring meter).
	Lease Lease
	// Record names the attribute whose value Match puts in Meter.Record, or "".
	Record string
	// Counter is the limit's counter (RuleLimit.Counter), or "".
	Counter string
}

// A Lease lets each instance serve a hot limit from a slice of its quota: the
// instance reserves Units in the store in one decision of cost Units (plus Margin,
// for a bucket) on the limit's key (so the store charges every reserved unit, and
// never more is admitted than the limit) and admits from them in process until they are spent or the lease ends, For
// after the reservation or at the end of the window it was reserved in, whichever
// comes first; what is unused then is given back (see package engine). The zero
// Lease is no lease.
//
// The price: units reserved by one instance are unavailable to the others until
// they are spent or given back, so at most Units times the number of instances of a
// limit's quota is held away from where the traffic is.
type Lease struct {
	Units int64         // units reserved at a time, 1 to the limit's capacity
	For   time.Duration // the longest a reservation is spent from, 1ms to 1h
}

// Margin is what a reservation of a bucket (token_bucket, gcra) charges beyond its
// Units and never gives back: the bucket's refill over For, rate × For rounded up.
// Units are spent up to For after the bucket gave them out, while it refills; the
// margin takes that refill out ahead, so that the units spent in any interval stay
// within capacity + rate × its length, as without leases. A window algorithm's
// reservation is spent inside its own window, and its margin is 0.
func (ls Lease) Margin(l algo.Limit) int64 {
	if l.Algorithm != algo.TokenBucket && l.Algorithm != algo.GCRA || l.Period <= 0 {
		return 0
	}
	num := new(big.Int).Mul(big.NewInt(l.Count), big.NewInt(int64(ls.For)))
	q, r := new(big.Int).QuoRem(num, big.NewInt(int64(l.Period)), new(big.Int))
	if r.Sign() > 0 {
		q.Add(q, big.NewInt(1))
	}
	if !q.IsInt64() {
		return 1 << 62
	}
	return q.Int64()
}

// leaseForHint suggests a lease's for for a bucket: half the longest for whose refill
// fits beside units in the burst.
func leaseForHint(l algo.Limit, units int64) time.Duration {
	d := time.Duration(float64(l.Period) * float64(max(0, l.Capacity()-units)) / float64(2*l.Count))
	return max(time.Millisecond, d.Truncate(time.Millisecond))
}

// Bounds of a lease's fields.
const (
	MinLeaseFor = time.Millisecond
	MaxLeaseFor = time.Hour
)

// CanLease reports whether limits of algorithm a can be served from leases: the
// counting algorithms, whose charge of n units at once is the charge of n units one
// by one (fixed_window, sliding_window, token_bucket, gcra). sliding_log records
// each request's own time, which a reservation made earlier cannot know;
// leaky_bucket shapes, giving each request its own delay from the queue at its
// arrival; bucket_ring counts in sub-window buckets of several windows on one key,
// and giving back a charge needs the bucket it went to, which only the store's undo
// data carries.
func CanLease(a algo.Algorithm) bool {
	return a == algo.FixedWindow || a == algo.SlidingWindow || a == algo.TokenBucket || a == algo.GCRA
}

// Problems returns what is wrong with the lease of limit l (which records the
// attribute record, in a shadow rule or not), each as a field under the lease
// ("units", "for") or "" for the lease as a whole, and its fix.
func (ls Lease) Problems(l algo.Limit, record string, shadow bool) [][2]string {
	var out [][2]string
	bad := func(field, msg string) { out = append(out, [2]string{field, msg}) }
	switch {
	case l.Algorithm.Valid() && !CanLease(l.Algorithm):
		bad("", fmt.Sprintf("%s cannot lease (each request must reach the store); remove lease or use fixed_window, sliding_window, token_bucket or gcra", l.Algorithm))
	case record != "":
		bad("", "a limit that records each request's value cannot lease; remove lease or record")
	case shadow:
		bad("", "a shadow rule's limits never deny, so there is nothing to lease; remove lease or shadow")
	}
	if ls.Units < 1 || (l.Count > 0 && ls.Units > l.Capacity()) {
		bad("units", fmt.Sprintf("units must be 1 to the limit's capacity (%d); a tenth of it or less leaves room for other instances, e.g. units: %d", l.Capacity(), max(1, l.Capacity()/10)))
	} else if m := ls.Margin(l); l.Count > 0 && ls.For > 0 && ls.Units+m > l.Capacity() {
		bad("for", fmt.Sprintf("a %s lease charges units plus the refill over for (%d + %d) at once, more than the burst of %d; shorten for (e.g. for: %v) or lower units", l.Algorithm, ls.Units, m, l.Capacity(), leaseForHint(l, ls.Units)))
	}
	if ls.For < MinLeaseFor || ls.For > MaxLeaseFor || ls.For%time.Millisecond != 0 {
		bad("for", "for must be a whole number of milliseconds from 1ms to 1h, e.g. for: 100ms")
	}
	return out
}

// RLQS serves a rule's limits to Envoy's rate limit quota filter (Envoy's Rate
// Limit Quota Service, package rlqs): the Envoys that report a bucket whose id
// matches the rule share each limit through grants of units taken from it in the
// store. Only fixed_window limits can be granted: a grant is spent inside the window
// it was taken from, and Envoy's own token bucket cannot keep a sliding estimate or a
// refill in step with the store's.
type RLQS struct {
	// ReportingInterval is how often Envoy reports a bucket's usage (its
	// reporting_interval; Envoy reports every 5s today whatever it says): a grant
	// covers the demand of about one interval. Default 5s, 1s to 60s, whole seconds.
	ReportingInterval time.Duration
}

// Defaults and bounds of the rlqs field.
const (
	DefaultRLQSReportingInterval = 5 * time.Second
	MinRLQSReportingInterval     = time.Second
	MaxRLQSReportingInterval     = time.Minute
)

// Problems returns what keeps rule r from being served over RLQS, each as a path
// under the rule ("limits[0].algorithm") and its fix.
func (q *RLQS) Problems(r *Rule) [][2]string {
	var out [][2]string
	bad := func(field, msg string) { out = append(out, [2]string{field, msg}) }
	switch {
	case r.Unlimited:
		bad("rlqs", "an unlimited rule has nothing to share; remove rlqs, or unlimited")
	case r.Settle:
		bad("rlqs", "a settling rule charges costs after the response, which Envoy's quota filter does not report; remove rlqs, or settle")
	case r.Shadow:
		bad("rlqs", "a shadow rule never denies, so there is no quota to share; remove rlqs, or shadow")
	}
	for i, l := range r.Limits {
		at := fmt.Sprintf("limits[%d]", i)
		for j := range i {
			if why := periodConflict(r.Limits[j].Limit, l.Limit); why != "" {
				bad(at+".rate", fmt.Sprintf("rule %q: limits[%d] and limits[%d]: %s", r.Name, j, i, why))
			}
		}
		switch {
		case l.Algorithm.Valid() && l.Algorithm != algo.FixedWindow:
			bad(at+".algorithm", fmt.Sprintf("rule %q: rlqs grants units of fixed_window limits only, not %s (a grant is spent inside the window it was taken from); use algorithm: fixed_window or remove rlqs", r.Name, l.Algorithm))
		case l.Calendar.Unit != "":
			bad(at+".calendar", fmt.Sprintf("rule %q: rlqs grants units of windows aligned to the epoch only; remove calendar or rlqs", r.Name))
		case l.Period%time.Second != 0 || l.Period > 0 && l.Period < 2*time.Second:
			bad(at+".rate", fmt.Sprintf("rule %q: Envoy times an assignment in whole seconds, so an rlqs window must be whole seconds, at least 2s (e.g. rate: 6000/10s)", r.Name))
		}
		if l.Lease != (Lease{}) {
			bad(at+".lease", fmt.Sprintf("rule %q: rlqs grants units to Envoys itself; remove lease", r.Name))
		}
		if l.Record != "" {
			bad(at+".record", fmt.Sprintf("rule %q: Envoy admits from its grant without telling which value each request had; remove record or rlqs", r.Name))
		}
		if l.Replicas != (algo.Replicas{}) {
			bad(at+".replicas", fmt.Sprintf("rule %q: rlqs does not wait for replicas; remove replicas or rlqs", r.Name))
		}
		if l.Counter != "" {
			bad(at+".counter", fmt.Sprintf("rule %q: an rlqs limit keeps its own counter; remove counter or rlqs", r.Name))
		}
	}
	return out
}

// periodConflict says why two rlqs limits that one bucket reaches cannot be shared
// together, or returns "" when they can. The service grants a bucket's units in the
// windows of its limit with the smallest count, taking them from every limit at
// once, and a grant expires before any of the limits' windows ends. That is exact,
// and serves each limit in full, when every other limit's window ends where one of
// those windows does and has a larger count: then the smallest count's windows are
// the windows of the share. Otherwise grants cut short by a shorter window hold
// their unspent units for the rest of the longer one (measured: 83 and 93 of 100
// per 10s admitted beside 1000/2s, with twice the demand), and units taken in one
// window of a longer limit could be granted again after it ends, while the share's
// window goes on (over-admission; the code allows it, no run has shown it). The
// test is pairwise, so it also refuses a limit that another makes redundant, and
// two periods that are not multiples of each other even where both are multiples
// of the smallest count's.
func periodConflict(a, b algo.Limit) string {
	if a.Period == b.Period || a.Period <= 0 || b.Period <= 0 {
		return ""
	}
	if a.Period > b.Period {
		a, b = b, a
	}
	ra, rb := fmt.Sprintf("%d/%s", a.Count, short(a.Period)), fmt.Sprintf("%d/%s", b.Count, short(b.Period))
	switch {
	case b.Period%a.Period != 0:
		return fmt.Sprintf("rlqs shares the limits one bucket reaches in the windows of the shortest, so each longer period must be a multiple of it (%s and %s are not); make %s a multiple of %s", ra, rb, short(b.Period), short(a.Period))
	case a.Count >= b.Count:
		return fmt.Sprintf("%s admits at most %d in any %s, so %s never denies; rlqs needs the shorter window to have the smaller count: remove %s", rb, b.Count, short(a.Period), ra, ra)
	}
	return ""
}

// Bounds of a limit's replicas field (algo.Replicas).
const (
	MaxReplicas        = 10
	MinReplicasTimeout = time.Millisecond
	MaxReplicasTimeout = time.Second
)

// Leasing reports whether some limit of the policy is served from leases.
func (p *Policy) Leasing() bool {
	for _, r := range p.Rules {
		for _, l := range r.Limits {
			if l.Lease != (Lease{}) {
				return true
			}
		}
	}
	return false
}

// A Problem is one thing wrong with a policy.
type Problem struct {
	// Path locates the problem: "domain", "rules[2].limits[0].rate"; empty for the
	// document as a whole.
	Path string
	// Msg says what is wrong and how to fix it.
	Msg string
	// Line is the line of the document where the problem is, or 0 if unknown.
	Line int
}

func (p Problem) String() string {
	s := p.Msg
	if p.Path != "" {
		s = p.Path + ": " + s
	}
	if p.Line > 0 {
		s += " (line " + strconv.Itoa(p.Line) + ")"
	}
	return s
}

// A ValidationError lists every problem of a policy. Parse and Load return one for
// anything wrong with the document itself: its size, its syntax, its content.
type ValidationError struct {
	// File is the file the policy came from (Load), or empty.
	File     string
	Problems []Problem
}

func (e *ValidationError) Error() string {
	head := "policy: "
	if e.File != "" {
		head += e.File + ": "
	}
	if len(e.Problems) == 1 {
		return head + e.Problems[0].String()
	}
	var b strings.Builder
	b.WriteString(head)
	if len(e.Problems) == 0 {
		b.WriteString("invalid")
		return b.String()
	}
	fmt.Fprintf(&b, "%d problems:", len(e.Problems))
	for _, p := range e.Problems {
		b.WriteString("\n\t")
		b.WriteString(p.String())
	}
	return b.String()
}

// Parse parses and validates a policy written in YAML or JSON. On any problem it
// returns a *ValidationError that lists every problem found. It never panics.
func Parse(data []byte) (*Policy, error) {
	if len(data) > MaxSize {
		return nil, &ValidationError{Problems: []Problem{{
			Msg: fmt.Sprintf("the policy is %d bytes; it must be at most %d bytes (1 MiB)", len(data), MaxSize),
		}}}
	}
	var d decoder
	p := d.parse(data)
	if len(d.problems) > 0 {
		return nil, &ValidationError{Problems: d.result()}
	}
	return p, nil
}

// Load reads and parses the policy file at path. Problems with the policy come as a
// *ValidationError whose File is path.
func Load(path string) (*Policy, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: load: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("policy: load %s: %w", path, err)
	}
	p, err := Parse(data)
	if ve, ok := errors.AsType[*ValidationError](err); ok {
		ve.File = path
		if len(data) > MaxSize {
			ve.Problems[0].Msg = fmt.Sprintf("the policy is larger than %d bytes (1 MiB); make it smaller", MaxSize)
		}
	}
	return p, err
}

// Attributes returns, sorted, the name of every attribute some rule matches on or
// records, so that a front door knows which attributes (and headers) to collect.
// The caller may modify the returned slice.
func (p *Policy) Attributes() []string {
	return append([]string(nil), p.attributes...)
}
