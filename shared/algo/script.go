package algo

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaOrder is the order in which the Lua files are joined into one source: helpers,
// the algorithms, then the entry points.
var luaOrder = []string{"prelude", "fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra", "leaky_bucket", "bucket_ring", "library"}

// An Entry is one entry point of the Lua library (see lua/library.lua).
type Entry string

// The entry points of the Lua library.
const (
	// EntryDecide decides every meter of one request, all-or-nothing.
	EntryDecide Entry = "decide"
	// EntryMany decides several independent requests in one call.
	EntryMany Entry = "many"
	// EntryRefund gives back the charges of a decide call made with undo data.
	EntryRefund Entry = "refund"
	// EntrySettle charges every meter of one request, never refusing (Meter.Settle).
	EntrySettle Entry = "settle"
)

// Entries lists every entry point of the Lua library.
var Entries = []Entry{EntryDecide, EntryMany, EntryRefund, EntrySettle}

// A Library is tollgate's Lua: every algorithm once, and the entry points that run
// them. A Library is immutable.
type Library struct {
	// Name is the library's name, "tollgate_" and a digest of its code, so that two
	// versions of tollgate on one Redis each call their own functions.
	Name string
	body string
}

// Lua returns tollgate's Lua library, built from the embedded files (a store builds it
// once; nothing is built in a program that never asks, such as the Envoy filter).
func Lua() Library {
	var b strings.Builder
	for _, name := range luaOrder {
		src, err := luaFiles.ReadFile("lua/" + name + ".lua")
		if err != nil {
			// The files are embedded at build time; a missing one is a build defect.
			panic("algo: missing embedded script " + name + ".lua")
		}
		b.WriteString("-- " + name + ".lua\n")
		b.Write(src)
		b.WriteString("\n")
	}
	sum := sha1.Sum([]byte(b.String()))
	return Library{Name: "tollgate_" + hex.EncodeToString(sum[:6]), body: b.String()}
}

// Function returns the name of entry e's function in the library, for FCALL.
func (l Library) Function(e Entry) string { return l.Name + "_" + string(e) }

// FunctionSource returns the library's source for FUNCTION LOAD: the code, then one
// redis.register_function per entry point.
func (l Library) FunctionSource() string {
	var b strings.Builder
	b.WriteString("#!lua name=" + l.Name + "\n")
	b.WriteString(l.body)
	for _, e := range Entries {
		fmt.Fprintf(&b, "redis.register_function('%s', E.%s)\n", l.Function(e), e)
	}
	return b.String()
}

// Script returns the source of a script that runs entry e with its KEYS and ARGV: the
// library's code, then a call of the entry, for EVAL and EVALSHA where the server has
// no Redis Functions. Such a script defines every function again on every call.
func (l Library) Script(e Entry) string {
	return l.body + "return E." + string(e) + "(KEYS, ARGV)\n"
}

// Arguments are built here only, for every entry point: numbers go as int64, which
// go-redis writes into its buffer without formatting a string first.

// appendMeterArgs appends decide's ARGV for one meter to dst: its spec and its record.
func appendMeterArgs(dst []any, m Meter) []any {
	return append(dst, m.spec(), m.Record)
}

// spec returns the meter's spec (lua/library.lua): its algorithm, shadow (0|1), then
// per limit count, period_us, capacity and bucket_us, separated by single spaces.
func (m Meter) spec() string {
	var bucket int64
	if m.Algorithm() == BucketRing {
		bucket = micros(m.RingBucket())
	}
	b := make([]byte, 0, 24+len(m.Limits)*40)
	b = append(b, m.Algorithm()...)
	if m.Shadow {
		b = append(b, " 1"...)
	} else {
		b = append(b, " 0"...)
	}
	for _, l := range m.Limits {
		fourth := bucket // a ring's bucket width, or a calendar window's start
		if l.WindowStartMicros != 0 {
			fourth = l.WindowStartMicros
		}
		for _, v := range [...]int64{l.Count, micros(l.Period), l.Capacity(), fourth} {
			b = append(b, ' ')
			b = strconv.AppendInt(b, v, 10)
		}
	}
	return string(b)
}

// AppendDecideArgs appends to dst the ARGV of the library's decide entry for c, with
// or without undo data (see lua/library.lua).
func AppendDecideArgs(dst []any, c Check, undo bool) []any {
	var now any = ""
	if c.NowMicros != 0 {
		now = c.NowMicros
	}
	var u any = "0"
	if undo {
		u = "1"
	}
	dst = append(dst, now, c.Cost, u, int64(len(c.Meters)))
	for _, m := range c.Meters {
		dst = appendMeterArgs(dst, m)
	}
	return dst
}

// DecideArgs returns the ARGV of the library's decide entry for meters, a request of
// cost units, at now in Unix microseconds (0: the Redis server's clock), with or
// without undo data.
func DecideArgs(meters []Meter, cost int64, now int64, undo bool) []any {
	return AppendDecideArgs(make([]any, 0, 4+len(meters)*2), Check{Meters: meters, Cost: cost, NowMicros: now}, undo)
}

// ManyCall returns the KEYS and ARGV of the library's many entry for checks, each
// decided without undo data: every check's keys (one per meter), then the request
// count and per check decide's ARGV.
func ManyCall(checks []Check) ([]string, []any) {
	var keys []string
	args := []any{int64(len(checks))}
	for _, c := range checks {
		keys = append(keys, c.Keys...)
		args = AppendDecideArgs(args, c, false)
	}
	return keys, args
}

// A Reply is the decoded answer of the library's decide entry.
type Reply struct {
	// NowMicros is the time the script decided at, in Unix microseconds.
	NowMicros int64
	// Allowed reports whether the request was admitted and charged.
	Allowed bool
	// Decisions holds, per meter, one decision per limit.
	Decisions [][]Decision
	// Undo holds what a refund needs, per charged meter, when the call asked for it.
	Undo []Undo
}

// Undo is what the library's refund entry needs to give back one meter's charge.
type Undo struct {
	Meter     int      // index of the meter in the call
	Keys      []string // the keys the charge wrote
	Before    []string // their DUMP before the charge ("" = absent)
	ExpiresMs []int64  // their PEXPIRETIME before the charge, Unix milliseconds
	After     []string // their DUMP after the charge
	Extra     []string // algorithm-specific data (sliding_log members, bucket_ring bucket)
}

// decisionSlices returns one empty decision per limit of meters, in one allocation for
// the common request of one limit and in two otherwise.
func decisionSlices(meters []Meter) [][]Decision {
	if len(meters) == 1 && len(meters[0].Limits) == 1 {
		one := new(struct {
			outer [1][]Decision
			d     [1]Decision
		})
		one.outer[0] = one.d[:]
		return one.outer[:]
	}
	n := 0
	for _, m := range meters {
		n += len(m.Limits)
	}
	flat := make([]Decision, n)
	out := make([][]Decision, len(meters))
	for i, m := range meters {
		out[i], flat = flat[:len(m.Limits):len(m.Limits)], flat[len(m.Limits):]
	}
	return out
}

// ParseDecideReply decodes the decide entry's reply for meters. Elements must be
// int64 or string, as go-redis returns them.
func ParseDecideReply(v any, meters []Meter) (Reply, error) {
	arr, ok := v.([]any)
	if !ok {
		return Reply{}, fmt.Errorf("algo: decide reply is %T, want an array", v)
	}
	r := replyReader{arr: arr}
	var stack [32]int64 // the decisions of up to six limits, without an allocation
	var head []int64
	if n := decideReplyLen(meters); n <= len(stack) {
		head = stack[:n]
	} else {
		head = make([]int64, n)
	}
	for i := range head {
		head[i] = r.int()
	}
	if r.err != nil {
		return Reply{}, r.err
	}
	rep := decodeDecisions(head, meters)
	for r.err == nil && r.pos < len(arr) {
		u := Undo{Meter: int(r.int())}
		if u.Meter < 0 || u.Meter >= len(meters) {
			return Reply{}, fmt.Errorf("algo: decide reply: undo for meter %d of %d", u.Meter, len(meters))
		}
		nk := int(r.int())
		if nk < 0 || nk > len(arr) {
			return Reply{}, fmt.Errorf("algo: decide reply: bad undo key count %d", nk)
		}
		for range nk {
			u.Keys = append(u.Keys, r.str())
			u.Before = append(u.Before, r.str())
			u.ExpiresMs = append(u.ExpiresMs, r.int())
			u.After = append(u.After, r.str())
		}
		ne := int(r.int())
		if ne < 0 || ne > len(arr) {
			return Reply{}, fmt.Errorf("algo: decide reply: bad undo extra count %d", ne)
		}
		for range ne {
			u.Extra = append(u.Extra, r.str())
		}
		rep.Undo = append(rep.Undo, u)
	}
	if r.err != nil {
		return Reply{}, r.err
	}
	return rep, nil
}

// ParseDecideInts decodes the reply of the decide entry called without undo data,
// read as integers (go-redis's IntSliceCmd): the same reply as ParseDecideReply's
// without boxing each element.
func ParseDecideInts(vals []int64, meters []Meter) (Reply, error) {
	if want := decideReplyLen(meters); len(vals) != want {
		return Reply{}, fmt.Errorf("algo: decide reply has %d integers for %d limits, want %d", len(vals), (want-2)/5, want)
	}
	return decodeDecisions(vals, meters), nil
}

// decideReplyLen is the length of a decision reply without undo data: the time, the
// request's outcome, and five integers per limit.
func decideReplyLen(meters []Meter) int {
	n := 2
	for _, m := range meters {
		n += 5 * len(m.Limits)
	}
	return n
}

// decodeDecisions decodes the first decideReplyLen(meters) integers of a reply.
func decodeDecisions(vals []int64, meters []Meter) Reply {
	rep := Reply{NowMicros: vals[0], Allowed: vals[1] == 1, Decisions: decisionSlices(meters)}
	vals = vals[2:]
	for i, m := range meters {
		ds := rep.Decisions[i]
		for j, l := range m.Limits {
			ds[j] = Decision{
				Allowed:    vals[0] == 1,
				Limit:      l.Count,
				Period:     l.Period,
				Remaining:  vals[1],
				ResetAfter: time.Duration(vals[2]) * time.Microsecond,
				RetryAfter: time.Duration(vals[3]) * time.Microsecond,
				Delay:      time.Duration(vals[4]) * time.Microsecond,
			}
			vals = vals[5:]
		}
	}
	return rep
}

// RefundCall returns the refund entry's KEYS and ARGV that give back the charges in
// undo, made at charged (Unix microseconds) for a request of cost units; refundNow is
// the time of the refund (0: the server's clock), from which the script reckons the
// refill that already made up for part of a charge. keys are the meters' keys, as
// passed to the decide entry.
func RefundCall(meters []Meter, keys []string, undo []Undo, charged, refundNow, cost int64) ([]string, []any) {
	var ks []string
	var now any = ""
	if refundNow != 0 {
		now = refundNow
	}
	args := []any{charged, now, cost, int64(len(undo))}
	for _, u := range undo {
		m := meters[u.Meter]
		args = appendMeterArgs(args, m)
		ks = append(ks, keys[u.Meter])
		ks = append(ks, u.Keys...)
		args = append(args, int64(len(u.Keys)))
		for k := range u.Keys {
			args = append(args, u.Before[k], u.ExpiresMs[k], u.After[k])
		}
		args = append(args, int64(len(u.Extra)))
		for _, e := range u.Extra {
			args = append(args, e)
		}
	}
	return ks, args
}

type replyReader struct {
	arr []any
	pos int
	err error
}

func (r *replyReader) next() any {
	if r.err != nil {
		return nil
	}
	if r.pos >= len(r.arr) {
		r.err = fmt.Errorf("algo: decide reply too short: %d elements", len(r.arr))
		return nil
	}
	v := r.arr[r.pos]
	r.pos++
	return v
}

func (r *replyReader) int() int64 {
	switch v := r.next().(type) {
	case int64:
		return v
	case nil:
		return 0
	default:
		r.err = fmt.Errorf("algo: decide reply element %d is %T, want an integer", r.pos-1, v)
		return 0
	}
}

func (r *replyReader) str() string {
	switch v := r.next().(type) {
	case string:
		return v
	case nil:
		return ""
	default:
		r.err = fmt.Errorf("algo: decide reply element %d is %T, want a string", r.pos-1, v)
		return ""
	}
}

// A Check is one request's meters, decided together: all are charged or none.
type Check struct {
	// Keys holds the key of each meter.
	Keys   []string
	Meters []Meter
	// Cost is the request's weight in units (1 for most requests).
	Cost int64
	// NowMicros is the decision time in Unix microseconds; 0 means the store's own
	// clock (the Redis server's TIME).
	NowMicros int64
	// Settle makes the check a settlement (Meter.Settle): every meter is charged Cost,
	// never refused, and may be left in debt. A store settles each cluster slot on its
	// own (nothing is refused, so nothing is all-or-nothing) and never batches or
	// refunds a settlement.
	Settle bool
}

// An Outcome is the answer to a Check.
type Outcome struct {
	// Allowed reports whether the request was admitted (and every meter charged).
	Allowed bool
	// Decisions holds, per meter, one decision per limit.
	Decisions [][]Decision
	// NowMicros is the time the decision was made at, in Unix microseconds.
	NowMicros int64
}

// Outcome is the answer the reply gives to its Check.
func (r Reply) Outcome() Outcome {
	return Outcome{Allowed: r.Allowed, Decisions: r.Decisions, NowMicros: r.NowMicros}
}
