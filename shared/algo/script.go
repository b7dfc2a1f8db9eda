package algo

import (
	"embed"
	"fmt"
	"strconv"
	"time"
)

//go:embed lua/*.lua
var luaFiles embed.FS

// luaOrder is the order in which the script files are concatenated: helpers, the
// algorithms, then the entry point. The decision script starts with fast.lua.
var luaOrder = []string{"prelude", "fixed_window", "sliding_log", "sliding_window", "token_bucket", "gcra", "leaky_bucket", "bucket_ring"}

func luaSource(entry string) string { return luaSourceFor(AllAlgorithms, entry) }

// An AlgorithmSet is a set of algorithms: bit i stands for Algorithms[i].
type AlgorithmSet uint8

// AllAlgorithms is the set of every algorithm of the catalogue.
const AllAlgorithms AlgorithmSet = 1<<7 - 1

// SetOf returns the set of the algorithms of meters.
func SetOf(meters []Meter) AlgorithmSet {
	var s AlgorithmSet
	for _, m := range meters {
		for i, a := range Algorithms {
			if m.Algorithm() == a {
				s |= 1 << i
			}
		}
	}
	return s
}

func (s AlgorithmSet) has(a Algorithm) bool {
	for i, b := range Algorithms {
		if a == b {
			return s&(1<<i) != 0
		}
	}
	return false
}

// DecideScriptFor returns the decision script with the Lua of the algorithms in set
// only (and of those they build on: leaky_bucket needs gcra's), so that Redis does not
// define every algorithm's functions on every call. A meter of another algorithm
// fails with "unknown algorithm", unless fast.lua's flat path (which every decision
// script starts with) decides it. DecideScriptFor(AllAlgorithms) is DecideScript().
func DecideScriptFor(set AlgorithmSet) string { return luaSourceFor(set, "decide") }

func luaSourceFor(set AlgorithmSet, entry string) string {
	var src []byte
	var names []string
	for _, name := range luaOrder {
		a := Algorithm(name)
		if name == "prelude" || set.has(a) || a == GCRA && set.has(LeakyBucket) {
			names = append(names, name)
		}
	}
	if entry == "decide" {
		// The flat path of the common request runs before any function is defined.
		names = append([]string{"fast"}, names...)
	}
	for _, name := range append(names, entry) {
		b, err := luaFiles.ReadFile("lua/" + name + ".lua")
		if err != nil {
			// The files are embedded at build time; a missing one is a build defect.
			panic("algo: missing embedded script " + name + ".lua")
		}
		src = append(src, "-- "+name+".lua\n"...)
		src = append(src, b...)
		src = append(src, '\n')
	}
	return string(src)
}

// DecideScript returns the Lua source of the decision script: every meter of one
// request, checked then charged all-or-nothing. See lua/decide.lua for its KEYS, ARGV
// and reply; DecideArgs and ParseDecideReply encode and decode them.
func DecideScript() string { return luaSource("decide") }

// DecideManyScript returns the Lua source of the script that decides several
// independent requests in one call, each as the decision script would. See
// lua/many.lua for its KEYS, ARGV and reply.
func DecideManyScript() string {
	many, err := luaFiles.ReadFile("lua/many.lua")
	if err != nil {
		panic("algo: missing embedded script many.lua")
	}
	return "local function decide(KEYS, ARGV)\n" + DecideScript() + "end\n-- many.lua\n" + string(many)
}

// RefundScript returns the Lua source of the refund script, which undoes a charge made
// by the decision script with undo on. See lua/refund.lua.
func RefundScript() string { return luaSource("refund") }

// AppendMeterArgs appends the decision script's ARGV for one meter to dst.
func AppendMeterArgs(dst []any, m Meter) []any {
	dst = append(dst, string(m.Algorithm()), boolArg(m.Shadow), m.Record, strconv.Itoa(len(m.Limits)))
	return appendLimitArgs(dst, m)
}

func appendLimitArgs(dst []any, m Meter) []any {
	var bucket int64
	if m.Algorithm() == BucketRing {
		bucket = micros(m.RingBucket())
	}
	for _, l := range m.Limits {
		fourth := bucket // a ring's bucket width, or a calendar window's start
		if l.WindowStartMicros != 0 {
			fourth = l.WindowStartMicros
		}
		dst = append(dst, strconv.FormatInt(l.Count, 10), strconv.FormatInt(micros(l.Period), 10),
			strconv.FormatInt(l.Capacity(), 10), strconv.FormatInt(fourth, 10))
	}
	return dst
}

func boolArg(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

// DecideArgs returns the decision script's ARGV for meters, a request of cost units, at
// now in Unix microseconds (0: the Redis server's clock), with or without undo data.
func DecideArgs(meters []Meter, cost int64, now int64, undo bool) []any {
	args := make([]any, 0, 4+len(meters)*8)
	nowArg := ""
	if now != 0 {
		nowArg = strconv.FormatInt(now, 10)
	}
	args = append(args, nowArg, strconv.FormatInt(cost, 10), boolArg(undo), strconv.Itoa(len(meters)))
	for _, m := range meters {
		args = AppendMeterArgs(args, m)
	}
	return args
}

// A Reply is the decoded answer of the decision script.
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

// Undo is what the refund script needs to give back one meter's charge.
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

// ParseDecideReply decodes the decision script's reply for meters. Elements must be
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

// ParseDecideInts decodes the reply of a decision script called without undo data,
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

// RefundCall returns the refund script's KEYS and ARGV that give back the charges in
// undo, made at charged (Unix microseconds) for a request of cost units; refundNow is
// the time of the refund (0: the server's clock), from which the script reckons the
// refill that already made up for part of a charge. keys are the meters' keys, as
// passed to the decision script.
func RefundCall(meters []Meter, keys []string, undo []Undo, charged, refundNow, cost int64) ([]string, []any) {
	var ks []string
	nowArg := ""
	if refundNow != 0 {
		nowArg = strconv.FormatInt(refundNow, 10)
	}
	args := []any{strconv.FormatInt(charged, 10), nowArg, strconv.FormatInt(cost, 10), strconv.Itoa(len(undo))}
	for _, u := range undo {
		m := meters[u.Meter]
		args = append(args, string(m.Algorithm()), m.Record, strconv.Itoa(len(m.Limits)))
		args = appendLimitArgs(args, m)
		ks = append(ks, keys[u.Meter])
		ks = append(ks, u.Keys...)
		args = append(args, strconv.Itoa(len(u.Keys)))
		for k := range u.Keys {
			args = append(args, u.Before[k], strconv.FormatInt(u.ExpiresMs[k], 10), u.After[k])
		}
		args = append(args, strconv.Itoa(len(u.Extra)))
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
