// Package jsonv reads JSON documents into a small tree without reflection, for the
// Envoy filter (compiled to wasm, where encoding/json makes the module about 0.65 MB
// larger and each request about 1.2× as slow; wasmfilter's BenchmarkJSONReader and
// BenchmarkVMStart measure it), and writes JSON strings (AppendString) as
// encoding/json does, for the filter's callout bodies.
//
// Parse is strict RFC 8259: one value with only whitespace around it, numbers as the
// grammar spells them, and strings of valid UTF-8 without control characters. It is
// stricter than encoding/json in four ways, so that a configuration read with it means
// one thing only:
//
//   - an object that names a key twice is an error (ErrDuplicateKey);
//   - invalid UTF-8 in a string is an error, not replaced with U+FFFD;
//   - a \u escape of an unpaired surrogate (\uD800 alone) is an error;
//   - arrays and objects nest at most MaxDepth deep (ErrTooDeep).
//
// The package imports only errors, strconv and unicode/utf8.
package jsonv

import (
	"errors"
	"strconv"
	"unicode/utf8"
)

// MaxDepth is how deeply arrays and objects may nest: [[1]] is two deep. Parse
// returns ErrTooDeep beyond it rather than recursing without bound.
const MaxDepth = 64

// A Kind is the type of a JSON value.
type Kind uint8

// The kinds of JSON value. Null is zero, so the zero Value is JSON null.
const (
	Null Kind = iota
	Bool
	Number
	String
	Array
	Object
)

var kindNames = [...]string{"null", "bool", "number", "string", "array", "object"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "Kind(" + strconv.Itoa(int(k)) + ")"
}

// A Value is one parsed JSON value and, for arrays and objects, everything in it. It
// shares no memory with the document it was parsed from. The zero Value is null.
// Values are immutable and safe for simultaneous use.
type Value struct {
	kind    Kind
	b       bool     // Bool
	s       string   // String: the decoded text; Number: the number as written
	elems   []Value  // Array
	members []Member // Object, in document order
}

// A Member is one key and value of an object.
type Member struct {
	Key   string
	Value Value
}

// Kind returns v's kind.
func (v Value) Kind() Kind { return v.kind }

// Get returns the value of the object member named key. ok is false when v is not an
// object or has no such member.
func (v Value) Get(key string) (Value, bool) {
	for _, m := range v.members {
		if m.Key == key {
			return m.Value, true
		}
	}
	return Value{}, false
}

// Members returns the members of an object in document order, or nil when v is not
// an object. The caller must not modify the slice.
func (v Value) Members() []Member { return v.members }

// Elems returns the elements of an array, or nil when v is not an array. The caller
// must not modify the slice.
func (v Value) Elems() []Value { return v.elems }

// Str returns a string's decoded text; ok is false when v is not a string.
func (v Value) Str() (s string, ok bool) {
	if v.kind != String {
		return "", false
	}
	return v.s, true
}

// Bool returns true or false; ok is false when v is not a boolean.
func (v Value) Bool() (b, ok bool) {
	if v.kind != Bool {
		return false, false
	}
	return v.b, true
}

// Num returns a number as written in the document, e.g. "1.50e3"; ok is false when v
// is not a number.
func (v Value) Num() (text string, ok bool) {
	if v.kind != Number {
		return "", false
	}
	return v.s, true
}

// Int returns an integer. ok is false when v is not a number, is written with a
// fraction or an exponent (1.0, 1e3), or does not fit an int64.
func (v Value) Int() (n int64, ok bool) {
	if v.kind != Number {
		return 0, false
	}
	n, err := strconv.ParseInt(v.s, 10, 64)
	return n, err == nil
}

// Float returns a number as the nearest float64. ok is false when v is not a number
// or its magnitude is too large for a float64.
func (v Value) Float() (f float64, ok bool) {
	if v.kind != Number {
		return 0, false
	}
	f, err := strconv.ParseFloat(v.s, 64)
	return f, err == nil
}

// The kinds of Error, for errors.Is.
var (
	ErrSyntax       = errors.New("jsonv: not JSON")
	ErrDuplicateKey = errors.New("jsonv: duplicate key")
	ErrTooDeep      = errors.New("jsonv: nested too deeply")
)

// An Error is a document Parse rejects. It wraps ErrSyntax, ErrDuplicateKey or
// ErrTooDeep.
type Error struct {
	// Offset is the byte offset in the document where the fault was found.
	Offset int
	// Path locates the fault: object members as .key, array elements as [i], e.g.
	// "attributes[0].name"; empty at the top level. For ErrDuplicateKey it names the
	// second member with the key.
	Path string
	// Msg says what was expected and what was found.
	Msg string
	// Err is ErrSyntax, ErrDuplicateKey or ErrTooDeep.
	Err error
}

func (e *Error) Error() string {
	s := "jsonv: " + e.Msg + " at offset " + strconv.Itoa(e.Offset)
	if e.Path != "" {
		s += " (in " + e.Path + ")"
	}
	return s
}

func (e *Error) Unwrap() error { return e.Err }

// within puts the path segment seg (a key, or [i]) in front of err's path.
func within(seg string, err error) error {
	if e, ok := err.(*Error); ok {
		switch {
		case e.Path == "":
			e.Path = seg
		case e.Path[0] == '[':
			e.Path = seg + e.Path
		default:
			e.Path = seg + "." + e.Path
		}
	}
	return err
}

// Parse reads a JSON document of exactly one value. The error, an *Error, gives the
// byte offset of the fault and what was expected there.
func Parse(data []byte) (Value, error) {
	p := parser{data: data}
	p.skipSpace()
	v, err := p.value(0)
	if err != nil {
		return Value{}, err
	}
	p.skipSpace()
	if p.pos < len(p.data) {
		return Value{}, p.fail("expected the end of the document after the value, found " + p.found())
	}
	return v, nil
}

// parser reads one document. pos is the offset of the next unread byte.
type parser struct {
	data []byte
	pos  int
}

func (p *parser) fail(msg string) error {
	return &Error{Offset: p.pos, Msg: msg, Err: ErrSyntax}
}

// found describes the byte at pos for an error message.
func (p *parser) found() string {
	if p.pos >= len(p.data) {
		return "the end of the document"
	}
	r, size := utf8.DecodeRune(p.data[p.pos:])
	if r == utf8.RuneError && size <= 1 {
		return "byte 0x" + hex(rune(p.data[p.pos]))[2:]
	}
	return strconv.QuoteRuneToASCII(r)
}

func (p *parser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

// value reads a value at pos, which is not whitespace. depth counts the arrays and
// objects around it.
func (p *parser) value(depth int) (Value, error) {
	if p.pos >= len(p.data) {
		return Value{}, p.fail("expected a value, found the end of the document")
	}
	switch c := p.data[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		s, err := p.str()
		return Value{kind: String, s: s}, err
	case c == '-' || c >= '0' && c <= '9':
		return p.number()
	case c == 't':
		return Value{kind: Bool, b: true}, p.literal("true")
	case c == 'f':
		return Value{kind: Bool}, p.literal("false")
	case c == 'n':
		return Value{}, p.literal("null")
	default:
		return Value{}, p.fail("expected a value (object, array, string, number, true, false or null), found " + p.found())
	}
}

func (p *parser) literal(word string) error {
	for i := 0; i < len(word); i++ {
		if p.pos >= len(p.data) || p.data[p.pos] != word[i] {
			return p.fail("expected " + word + ", found " + p.found())
		}
		p.pos++
	}
	return nil
}

// tooDeep reports an *Error when depth is beyond MaxDepth.
func (p *parser) tooDeep(depth int) error {
	if depth <= MaxDepth {
		return nil
	}
	return &Error{Offset: p.pos, Msg: "arrays and objects nested more than " + strconv.Itoa(MaxDepth) + " deep", Err: ErrTooDeep}
}

// array reads an array at pos, its '['.
func (p *parser) array(depth int) (Value, error) {
	if err := p.tooDeep(depth); err != nil {
		return Value{}, err
	}
	p.pos++
	p.skipSpace()
	v := Value{kind: Array}
	if p.pos < len(p.data) && p.data[p.pos] == ']' {
		p.pos++
		return v, nil
	}
	for {
		e, err := p.value(depth)
		if err != nil {
			return Value{}, within("["+strconv.Itoa(len(v.elems))+"]", err)
		}
		v.elems = append(v.elems, e)
		if done, err := p.separator(']', "an array element"); err != nil || done {
			return v, err
		}
	}
}

// indexAt is the member count from which object uses a map to find duplicate keys;
// below it a linear scan is cheaper.
const indexAt = 16

// object reads an object at pos, its '{'.
func (p *parser) object(depth int) (Value, error) {
	if err := p.tooDeep(depth); err != nil {
		return Value{}, err
	}
	p.pos++
	p.skipSpace()
	v := Value{kind: Object}
	if p.pos < len(p.data) && p.data[p.pos] == '}' {
		p.pos++
		return v, nil
	}
	var index map[string]bool
	for {
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return Value{}, p.fail("expected a string key, found " + p.found())
		}
		keyAt := p.pos
		key, err := p.str()
		if err != nil {
			return Value{}, err
		}
		if p.seen(&v, index, key) {
			return Value{}, &Error{Offset: keyAt, Path: key, Msg: "duplicate key " + strconv.Quote(key), Err: ErrDuplicateKey}
		}
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != ':' {
			return Value{}, p.fail("expected ':' after the key " + strconv.Quote(key) + ", found " + p.found())
		}
		p.pos++
		p.skipSpace()
		m, err := p.value(depth)
		if err != nil {
			return Value{}, within(key, err)
		}
		v.members = append(v.members, Member{Key: key, Value: m})
		if len(v.members) == indexAt {
			index = make(map[string]bool, 2*indexAt)
			for _, m := range v.members {
				index[m.Key] = true
			}
		} else if index != nil {
			index[key] = true
		}
		if done, err := p.separator('}', "an object member"); err != nil || done {
			return v, err
		}
	}
}

// separator reads what follows an element of an array or a member of an object
// (what): a ',' before the next, or close, which ends it (done).
func (p *parser) separator(close byte, what string) (done bool, err error) {
	p.skipSpace()
	if p.pos >= len(p.data) {
		return false, p.fail("expected ',' or '" + string(close) + "' after " + what + ", found the end of the document")
	}
	switch p.data[p.pos] {
	case ',':
		p.pos++
		p.skipSpace()
		return false, nil
	case close:
		p.pos++
		return true, nil
	}
	return false, p.fail("expected ',' or '" + string(close) + "' after " + what + ", found " + p.found())
}

// seen reports whether obj already has a member named key.
func (p *parser) seen(obj *Value, index map[string]bool, key string) bool {
	if index != nil {
		return index[key]
	}
	for _, m := range obj.members {
		if m.Key == key {
			return true
		}
	}
	return false
}

// number reads a number at pos: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (p *parser) number() (Value, error) {
	start := p.pos
	if p.data[p.pos] == '-' {
		p.pos++
	}
	switch {
	case p.pos >= len(p.data) || !isDigit(p.data[p.pos]):
		return Value{}, p.fail("expected a digit after '-', found " + p.found())
	case p.data[p.pos] == '0':
		p.pos++
		if p.pos < len(p.data) && isDigit(p.data[p.pos]) {
			return Value{}, p.fail("a number must not start with 0 followed by digits, found " + p.found())
		}
	default:
		p.digits()
	}
	if p.pos < len(p.data) && p.data[p.pos] == '.' {
		p.pos++
		if p.pos >= len(p.data) || !isDigit(p.data[p.pos]) {
			return Value{}, p.fail("expected a digit after '.', found " + p.found())
		}
		p.digits()
	}
	if p.pos < len(p.data) && (p.data[p.pos] == 'e' || p.data[p.pos] == 'E') {
		p.pos++
		if p.pos < len(p.data) && (p.data[p.pos] == '+' || p.data[p.pos] == '-') {
			p.pos++
		}
		if p.pos >= len(p.data) || !isDigit(p.data[p.pos]) {
			return Value{}, p.fail("expected a digit in the exponent, found " + p.found())
		}
		p.digits()
	}
	return Value{kind: Number, s: string(p.data[start:p.pos])}, nil
}

func (p *parser) digits() {
	for p.pos < len(p.data) && isDigit(p.data[p.pos]) {
		p.pos++
	}
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// str reads a string at pos, its opening quote, and returns its decoded text.
func (p *parser) str() (string, error) {
	p.pos++
	start := p.pos
	// The common case, a string without escapes, is one copy of the document's bytes.
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			s := string(p.data[start:p.pos])
			p.pos++
			return s, nil
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", p.fail("control character U+" + hex(rune(c)) + ` in a string; write it as \u` + hex(rune(c)))
		case c < utf8.RuneSelf:
			p.pos++
		default:
			if err := p.utf8(); err != nil {
				return "", err
			}
		}
	}
	return "", p.fail("expected '\"' to end the string, found the end of the document")
}

// escaped finishes a string that began at start and has an escape at pos.
func (p *parser) escaped(start int) (string, error) {
	buf := append(make([]byte, 0, p.pos-start+16), p.data[start:p.pos]...)
	for p.pos < len(p.data) {
		c := p.data[p.pos]
		switch {
		case c == '"':
			p.pos++
			return string(buf), nil
		case c == '\\':
			r, err := p.escape()
			if err != nil {
				return "", err
			}
			buf = utf8.AppendRune(buf, r)
		case c < 0x20:
			return "", p.fail("control character U+" + hex(rune(c)) + ` in a string; write it as \u` + hex(rune(c)))
		case c < utf8.RuneSelf:
			buf = append(buf, c)
			p.pos++
		default:
			at := p.pos
			if err := p.utf8(); err != nil {
				return "", err
			}
			buf = append(buf, p.data[at:p.pos]...)
		}
	}
	return "", p.fail("expected '\"' to end the string, found the end of the document")
}

// escape reads the escape at pos, its backslash, and returns the character it stands for.
func (p *parser) escape() (rune, error) {
	if p.pos+1 >= len(p.data) {
		p.pos++
		return 0, p.fail("expected an escape after '\\', found the end of the document")
	}
	p.pos++
	c := p.data[p.pos]
	p.pos++
	switch c {
	case '"', '\\', '/':
		return rune(c), nil
	case 'b':
		return '\b', nil
	case 'f':
		return '\f', nil
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'u':
	default:
		p.pos--
		return 0, p.fail(`invalid escape \` + p.found() + `; the escapes are \" \\ \/ \b \f \n \r \t and \uXXXX`)
	}
	at := p.pos - 2
	r, err := p.hex4()
	if err != nil {
		return 0, err
	}
	switch {
	case r < 0xD800 || r > 0xDFFF:
		return r, nil
	case r >= 0xDC00:
		p.pos = at
		return 0, p.fail(`unpaired surrogate \u` + hex(r) + " (a low surrogate without a high one before it)")
	}
	// A high surrogate must be followed by \u and a low surrogate.
	if p.pos+1 < len(p.data) && p.data[p.pos] == '\\' && p.data[p.pos+1] == 'u' {
		p.pos += 2
		lo, err := p.hex4()
		if err != nil {
			return 0, err
		}
		if lo >= 0xDC00 && lo <= 0xDFFF {
			return 0x10000 + (r-0xD800)<<10 + (lo - 0xDC00), nil
		}
	}
	p.pos = at
	return 0, p.fail(`unpaired surrogate \u` + hex(r) + " (a high surrogate must be followed by a low one, \\uDC00 to \\uDFFF)")
}

// hex4 reads the four hex digits of a \u escape at pos.
func (p *parser) hex4() (rune, error) {
	var r rune
	for i := 0; i < 4; i++ {
		if p.pos >= len(p.data) {
			return 0, p.fail(`expected 4 hex digits after \u, found the end of the document`)
		}
		c := p.data[p.pos]
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return 0, p.fail(`expected 4 hex digits after \u, found ` + p.found())
		}
		p.pos++
	}
	return r, nil
}

// utf8 steps over the multi-byte UTF-8 sequence at pos.
func (p *parser) utf8() error {
	r, size := utf8.DecodeRune(p.data[p.pos:])
	if r == utf8.RuneError && size <= 1 {
		return p.fail("invalid UTF-8 in a string: found " + p.found())
	}
	p.pos += size
	return nil
}

// hex returns r, at most 0xFFFF, as four upper-case hex digits.
func hex(r rune) string {
	const digits = "0123456789ABCDEF"
	return string([]byte{digits[r>>12&0xF], digits[r>>8&0xF], digits[r>>4&0xF], digits[r&0xF]})
}

const hexDigits = "0123456789abcdef"

// AppendString appends s to b as a JSON string, the bytes encoding/json writes for it
// (json.Marshal with escapeHTML, an Encoder with SetEscapeHTML(false) without): '"'
// and '\\' escaped with a backslash, \b \f \n \r \t by name, other control
// characters as \u00XX, with escapeHTML also <, > and &, U+2028 and U+2029 as
// \u2028 and \u2029, and each byte of invalid UTF-8 as \ufffd (where Parse rejects
// invalid UTF-8, AppendString replaces it).
func AppendString(b []byte, s string, escapeHTML bool) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && (!escapeHTML || c != '<' && c != '>' && c != '&') {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
