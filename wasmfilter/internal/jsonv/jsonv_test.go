package jsonv

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// toAny converts v to what encoding/json's Decoder with UseNumber produces.
func toAny(v Value) any {
	switch v.Kind() {
	case Bool:
		b, _ := v.Bool()
		return b
	case Number:
		n, _ := v.Num()
		return json.Number(n)
	case String:
		s, _ := v.Str()
		return s
	case Array:
		out := []any{}
		for _, e := range v.Elems() {
			out = append(out, toAny(e))
		}
		return out
	case Object:
		out := map[string]any{}
		for _, m := range v.Members() {
			out[m.Key] = toAny(m.Value)
		}
		return out
	default:
		return nil
	}
}

// stdDecode decodes data as encoding/json does, numbers as json.Number.
func stdDecode(t *testing.T, data []byte) any {
	t.Helper()
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var out any
	if err := d.Decode(&out); err != nil {
		t.Fatalf("encoding/json cannot decode %q: %v", data, err)
	}
	return out
}

var validDocs = []string{
	`null`, `true`, `false`, `0`, `-0`, `1`, `-1`, `10`, `123456789`, `0.5`, `-0.5e-3`,
	`1E10`, `1e+10`, `2.5E-1`, `""`, `"a"`, `" \t"`, `"\u00e9\u20AC\ud83d\ude00"`,
	`"\"\\\/\b\f\n\r\t"`, `"héllo wörld €😀"`, "\"\u2028\u2029\u007f\"",
	`[]`, `[ ]`, `[1]`, `[1,2,3]`, `[[],[[]],{}]`, `{}`, `{ }`, `{"a":1}`,
	`{"a":{"b":[true,false,null]},"c":"d"}`, `{"":0}`, `{"a":1,"A":2}`, `{"\u0061":1,"b":2}`,
	" \t\r\n{\"k\" : [ 1 , \"x\" ] }\n ",
	`{"cluster": "tollgate_decision", "domain": "public-api", "attributes": [{"name": "api_key", "from": "header", "header": "x-api-key"}]}`,
	`123456789012345678901234567890`, `1e400`, `-1e-400`,
}

// TestParseValid checks each valid document against encoding/json's reading of it.
func TestParseValid(t *testing.T) {
	t.Parallel()
	for _, doc := range validDocs {
		t.Run(doc, func(t *testing.T) {
			t.Parallel()
			v, err := Parse([]byte(doc))
			if err != nil {
				t.Fatalf("Parse(%q) error: %v", doc, err)
			}
			if got, want := toAny(v), stdDecode(t, []byte(doc)); !reflect.DeepEqual(got, want) {
				t.Errorf("Parse(%q) = %#v, want %#v", doc, got, want)
			}
		})
	}
}

// TestParseInvalid checks the error of each invalid document: its text, offset, path
// and kind.
func TestParseInvalid(t *testing.T) {
	t.Parallel()
	tests := []struct {
		doc    string
		offset int
		path   string
		kind   error
		msg    string
	}{
		{``, 0, "", ErrSyntax, `expected a value, found the end of the document`},
		{"  \n", 3, "", ErrSyntax, `expected a value, found the end of the document`},
		{`nul`, 3, "", ErrSyntax, `expected null, found the end of the document`},
		{`trUe`, 2, "", ErrSyntax, `expected true, found 'U'`},
		{`fals e`, 4, "", ErrSyntax, `expected false, found ' '`},
		{`True`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found 'T'`},
		{`'a'`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '\''`},
		{`1 2`, 2, "", ErrSyntax, `expected the end of the document after the value, found '2'`},
		{`{}}`, 2, "", ErrSyntax, `expected the end of the document after the value, found '}'`},
		{"\xef\xbb\xbf{}", 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '\ufeff'`},
		{"\x00", 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '\x00'`},
		{"\xff", 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found byte 0xFF`},
		{"[1]\v", 3, "", ErrSyntax, `expected the end of the document after the value, found '\v'`},

		{`-`, 1, "", ErrSyntax, `expected a digit after '-', found the end of the document`},
		{`-a`, 1, "", ErrSyntax, `expected a digit after '-', found 'a'`},
		{`+1`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '+'`},
		{`01`, 1, "", ErrSyntax, `a number must not start with 0 followed by digits, found '1'`},
		{`-00`, 2, "", ErrSyntax, `a number must not start with 0 followed by digits, found '0'`},
		{`1.`, 2, "", ErrSyntax, `expected a digit after '.', found the end of the document`},
		{`.5`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '.'`},
		{`1.e3`, 2, "", ErrSyntax, `expected a digit after '.', found 'e'`},
		{`1e`, 2, "", ErrSyntax, `expected a digit in the exponent, found the end of the document`},
		{`1e+`, 3, "", ErrSyntax, `expected a digit in the exponent, found the end of the document`},
		{`1E-x`, 3, "", ErrSyntax, `expected a digit in the exponent, found 'x'`},
		{`0x10`, 1, "", ErrSyntax, `expected the end of the document after the value, found 'x'`},
		{`NaN`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found 'N'`},
		{`Infinity`, 0, "", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found 'I'`},

		{`"abc`, 4, "", ErrSyntax, `expected '"' to end the string, found the end of the document`},
		{`"a\"`, 4, "", ErrSyntax, `expected '"' to end the string, found the end of the document`},
		{"\"a\nb\"", 2, "", ErrSyntax, `control character U+000A in a string; write it as \u000A`},
		{"\"\\n\t\"", 3, "", ErrSyntax, `control character U+0009 in a string; write it as \u0009`},
		{"\"\x7f\xff\"", 2, "", ErrSyntax, `invalid UTF-8 in a string: found byte 0xFF`},
		{"\"\\n\xc3\"", 3, "", ErrSyntax, `invalid UTF-8 in a string: found byte 0xC3`},
		{"\"\xed\xa0\x80\"", 1, "", ErrSyntax, `invalid UTF-8 in a string: found byte 0xED`},
		{"\"\xc0\xaf\"", 1, "", ErrSyntax, `invalid UTF-8 in a string: found byte 0xC0`},
		{`"\x41"`, 2, "", ErrSyntax, `invalid escape \'x'; the escapes are \" \\ \/ \b \f \n \r \t and \uXXXX`},
		{`"\'"`, 2, "", ErrSyntax, `invalid escape \'\''; the escapes are \" \\ \/ \b \f \n \r \t and \uXXXX`},
		{`"\`, 2, "", ErrSyntax, `expected an escape after '\', found the end of the document`},
		{`"\u12"`, 5, "", ErrSyntax, `expected 4 hex digits after \u, found '"'`},
		{`"\u12`, 5, "", ErrSyntax, `expected 4 hex digits after \u, found the end of the document`},
		{`"\uD800"`, 1, "", ErrSyntax, `unpaired surrogate \uD800 (a high surrogate must be followed by a low one, \uDC00 to \uDFFF)`},
		{`"\ud83d\u0041"`, 1, "", ErrSyntax, `unpaired surrogate \uD83D (a high surrogate must be followed by a low one, \uDC00 to \uDFFF)`},
		{`"\ud83d\ud83d"`, 1, "", ErrSyntax, `unpaired surrogate \uD83D (a high surrogate must be followed by a low one, \uDC00 to \uDFFF)`},
		{`"\ud83d\uDE"`, 11, "", ErrSyntax, `expected 4 hex digits after \u, found '"'`},
		{`"x\uDE00"`, 2, "", ErrSyntax, `unpaired surrogate \uDE00 (a low surrogate without a high one before it)`},

		{`[`, 1, "[0]", ErrSyntax, `expected a value, found the end of the document`},
		{`[1`, 2, "", ErrSyntax, `expected ',' or ']' after an array element, found the end of the document`},
		{`[1,]`, 3, "[1]", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found ']'`},
		{`[,1]`, 1, "[0]", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found ','`},
		{`[1 2]`, 3, "", ErrSyntax, `expected ',' or ']' after an array element, found '2'`},
		{`[1}`, 2, "", ErrSyntax, `expected ',' or ']' after an array element, found '}'`},
		{`{`, 1, "", ErrSyntax, `expected a string key, found the end of the document`},
		{`{,}`, 1, "", ErrSyntax, `expected a string key, found ','`},
		{`{a:1}`, 1, "", ErrSyntax, `expected a string key, found 'a'`},
		{`{"a":1,}`, 7, "", ErrSyntax, `expected a string key, found '}'`},
		{`{"a" 1}`, 5, "", ErrSyntax, `expected ':' after the key "a", found '1'`},
		{`{"a":}`, 5, "a", ErrSyntax, `expected a value (object, array, string, number, true, false or null), found '}'`},
		{`{"a":1 "b":2}`, 7, "", ErrSyntax, `expected ',' or '}' after an object member, found '"'`},
		{`{"a":1`, 6, "", ErrSyntax, `expected ',' or '}' after an object member, found the end of the document`},
		{`{"a":1]`, 6, "", ErrSyntax, `expected ',' or '}' after an object member, found ']'`},
		{`{"a":[{"b":[1,{"c":tru}]}]}`, 22, "a[0].b[1].c", ErrSyntax, `expected true, found '}'`},
		{`[{"a\u00":1}]`, 8, "[0]", ErrSyntax, `expected 4 hex digits after \u, found '"'`},

		{`{"a":1,"a":2}`, 7, "a", ErrDuplicateKey, `duplicate key "a"`},
		{`{"a":1,"\u0061":2}`, 7, "a", ErrDuplicateKey, `duplicate key "a"`},
		{`{"attributes":[{"name":"k","from":"method","name":"j"}]}`, 43, "attributes[0].name", ErrDuplicateKey, `duplicate key "name"`},
		{`[{}, {"x": {"": 1, "": 2}}]`, 19, "[1].x", ErrDuplicateKey, `duplicate key ""`},
	}
	for _, tc := range tests {
		t.Run(tc.doc, func(t *testing.T) {
			t.Parallel()
			v, err := Parse([]byte(tc.doc))
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse(%q) = %v, %v; want an *Error", tc.doc, toAny(v), err)
			}
			want := &Error{Offset: tc.offset, Path: tc.path, Msg: tc.msg, Err: tc.kind}
			if *e != *want {
				t.Errorf("Parse(%q) error = %#v, want %#v", tc.doc, e, want)
			}
			if !errors.Is(err, tc.kind) {
				t.Errorf("errors.Is(Parse(%q), %v) = false, want true", tc.doc, tc.kind)
			}
			if !reflect.DeepEqual(v, Value{}) {
				t.Errorf("Parse(%q) value = %#v, want the zero Value with an error", tc.doc, v)
			}
		})
	}
}

func TestErrorText(t *testing.T) {
	t.Parallel()
	tests := []struct{ doc, want string }{
		{`[1 2]`, `jsonv: expected ',' or ']' after an array element, found '2' at offset 3`},
		{`{"a":{"a":1,"a":2}}`, `jsonv: duplicate key "a" at offset 12 (in a.a)`},
	}
	for _, tc := range tests {
		_, err := Parse([]byte(tc.doc))
		if err == nil || err.Error() != tc.want {
			t.Errorf("Parse(%q) error = %v, want %s", tc.doc, err, tc.want)
		}
	}
}

// TestEscapesRoundTrip writes strings with encoding/json, and with every character
// escaped as \uXXXX (a surrogate pair beyond U+FFFF), and reads them back.
func TestEscapesRoundTrip(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for r := rune(0); r < 0x300; r++ {
		all.WriteRune(r)
	}
	strs := []string{
		"", "plain", `quote " backslash \ slash /`, "\b\f\n\r\t", "\x00\x01\x1f\x7f",
		"<tag>&amp;", "\u2028\u2029", "é€😀𝄞", "\U0010FFFF\U00010000\uFFFF\uE000\uD7FF",
		all.String(),
	}
	for _, s := range strs {
		std, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var esc strings.Builder
		esc.WriteByte('"')
		for _, r := range s {
			if r > 0xFFFF {
				r -= 0x10000
				fmt.Fprintf(&esc, `\u%04x\u%04X`, 0xD800+r>>10, 0xDC00+r&0x3FF)
			} else {
				fmt.Fprintf(&esc, `\u%04x`, r)
			}
		}
		esc.WriteByte('"')
		for _, doc := range []string{string(std), esc.String()} {
			v, err := Parse([]byte(doc))
			if err != nil {
				t.Errorf("Parse(%s) error: %v", doc, err)
				continue
			}
			if got, ok := v.Str(); !ok || got != s {
				t.Errorf("Parse(%s).Str() = %q, %v, want %q, true", doc, got, ok, s)
			}
		}
	}
}

func TestDepthLimit(t *testing.T) {
	t.Parallel()
	nest := func(n int, open, close string) []byte {
		return []byte(strings.Repeat(open, n) + "1" + strings.Repeat(close, n))
	}
	for _, tc := range []struct{ open, close string }{{"[", "]"}, {`{"k":`, "}"}, {`[{"k":`, "}]"}} {
		deep := MaxDepth
		if len(tc.open) > 5 {
			deep = MaxDepth / 2
		}
		if _, err := Parse(nest(deep, tc.open, tc.close)); err != nil {
			t.Errorf("Parse(%d of %s) error: %v", deep, tc.open, err)
		}
		for _, n := range []int{deep + 1, 1_000_000} {
			_, err := Parse(nest(n, tc.open, tc.close))
			if !errors.Is(err, ErrTooDeep) {
				t.Errorf("Parse(%d of %s) error = %v, want ErrTooDeep", n, tc.open, err)
			}
		}
	}
	_, err := Parse(nest(MaxDepth+1, "[", "]"))
	want := &Error{Offset: MaxDepth, Path: strings.Repeat("[0]", MaxDepth), Msg: "arrays and objects nested more than 64 deep", Err: ErrTooDeep}
	if e, ok := err.(*Error); !ok || *e != *want {
		t.Errorf("Parse(65 arrays) error = %#v, want %#v", err, want)
	}
}

func TestNumbers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		doc     string
		n       int64
		intOK   bool
		f       float64
		floatOK bool
	}{
		{`0`, 0, true, 0, true},
		{`-0`, 0, true, math.Copysign(0, -1), true},
		{`42`, 42, true, 42, true},
		{`-17`, -17, true, -17, true},
		{`9223372036854775807`, math.MaxInt64, true, math.MaxInt64, true},
		{`-9223372036854775808`, math.MinInt64, true, math.MinInt64, true},
		{`9223372036854775808`, 0, false, 9223372036854775808, true},
		{`-9223372036854775809`, 0, false, -9223372036854775809, true},
		{`123456789012345678901234567890`, 0, false, 1.2345678901234568e29, true},
		{`1.0`, 0, false, 1, true},
		{`1e3`, 0, false, 1000, true},
		{`1.5`, 0, false, 1.5, true},
		{`2.5E-3`, 0, false, 0.0025, true},
		{`1e308`, 0, false, 1e308, true},
		{`1e309`, 0, false, 0, false},
		{`-1e400`, 0, false, 0, false},
		{`1e-400`, 0, false, 0, true},
	}
	for _, tc := range tests {
		v, err := Parse([]byte(tc.doc))
		if err != nil {
			t.Errorf("Parse(%s) error: %v", tc.doc, err)
			continue
		}
		if text, ok := v.Num(); !ok || text != tc.doc {
			t.Errorf("Parse(%s).Num() = %q, %v, want %q, true", tc.doc, text, ok, tc.doc)
		}
		if n, ok := v.Int(); n != tc.n && tc.intOK || ok != tc.intOK {
			t.Errorf("Parse(%s).Int() = %d, %v, want %d, %v", tc.doc, n, ok, tc.n, tc.intOK)
		}
		f, ok := v.Float()
		if ok != tc.floatOK || ok && (f != tc.f || math.Signbit(f) != math.Signbit(tc.f)) {
			t.Errorf("Parse(%s).Float() = %v, %v, want %v, %v", tc.doc, f, ok, tc.f, tc.floatOK)
		}
	}
}

// TestAccessors checks that each accessor answers only for its own kind, and Get and
// Members keep the document's order.
func TestAccessors(t *testing.T) {
	t.Parallel()
	v, err := Parse([]byte(`{"z":null,"b":true,"n":7,"s":"x","a":[1,"2"],"o":{"k":false}}`))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, m := range v.Members() {
		keys = append(keys, m.Key)
	}
	if want := []string{"z", "b", "n", "s", "a", "o"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("Members() keys = %v, want %v", keys, want)
	}
	wantKinds := map[string]Kind{"z": Null, "b": Bool, "n": Number, "s": String, "a": Array, "o": Object}
	for key, kind := range wantKinds {
		m, ok := v.Get(key)
		if !ok || m.Kind() != kind {
			t.Errorf("Get(%q) = %v, %v, want a %v", key, m.Kind(), ok, kind)
			continue
		}
		if _, ok := m.Str(); ok != (kind == String) {
			t.Errorf("Get(%q).Str() ok = %v", key, ok)
		}
		if _, ok := m.Bool(); ok != (kind == Bool) {
			t.Errorf("Get(%q).Bool() ok = %v", key, ok)
		}
		if _, ok := m.Int(); ok != (kind == Number) {
			t.Errorf("Get(%q).Int() ok = %v", key, ok)
		}
		if _, ok := m.Float(); ok != (kind == Number) {
			t.Errorf("Get(%q).Float() ok = %v", key, ok)
		}
		if _, ok := m.Num(); ok != (kind == Number) {
			t.Errorf("Get(%q).Num() ok = %v", key, ok)
		}
		if got := m.Elems() != nil; got != (kind == Array) {
			t.Errorf("Get(%q).Elems() != nil = %v", key, got)
		}
		if got := m.Members() != nil; got != (kind == Object) {
			t.Errorf("Get(%q).Members() != nil = %v", key, got)
		}
	}
	if m, ok := v.Get("missing"); ok || m.Kind() != Null {
		t.Errorf("Get(missing) = %v, %v, want null, false", m.Kind(), ok)
	}
	a, _ := v.Get("a")
	if _, ok := a.Get("0"); ok {
		t.Errorf("Get on an array found a member")
	}
	if b, ok := v.Get("b"); ok {
		if got, ok := b.Bool(); !got || !ok {
			t.Errorf("Get(b).Bool() = %v, %v, want true, true", got, ok)
		}
	}
	if Kind(9).String() != "Kind(9)" || Object.String() != "object" {
		t.Errorf("Kind.String() = %q, %q", Kind(9).String(), Object.String())
	}
}

// TestLargeObject crosses the size at which duplicate keys are found with a map.
func TestLargeObject(t *testing.T) {
	t.Parallel()
	for _, n := range []int{indexAt - 1, indexAt, indexAt + 1, 1000} {
		var b strings.Builder
		b.WriteString("{")
		for i := 0; i < n; i++ {
			fmt.Fprintf(&b, `"k%d":%d,`, i, i)
		}
		ok := b.String()[:b.Len()-1] + "}"
		v, err := Parse([]byte(ok))
		if err != nil || len(v.Members()) != n {
			t.Fatalf("Parse(%d members) = %d members, %v", n, len(v.Members()), err)
		}
		if last, _ := v.Get(fmt.Sprintf("k%d", n-1)); toAny(last) != json.Number(fmt.Sprint(n-1)) {
			t.Errorf("Parse(%d members).Get(last) = %v", n, toAny(last))
		}
		for _, dup := range []int{0, n / 2, n - 1} {
			doc := b.String() + fmt.Sprintf(`"k%d":0}`, dup)
			_, err := Parse([]byte(doc))
			if !errors.Is(err, ErrDuplicateKey) {
				t.Errorf("Parse(%d members, k%d twice) error = %v, want ErrDuplicateKey", n, dup, err)
			}
		}
	}
}

// TestNoAliasing checks that a Value does not share memory with the document.
func TestNoAliasing(t *testing.T) {
	t.Parallel()
	doc := []byte(`{"key":"value","n":12}`)
	v, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range doc {
		doc[i] = 'x'
	}
	if got := toAny(v); !reflect.DeepEqual(got, map[string]any{"key": "value", "n": json.Number("12")}) {
		t.Errorf("after the document changed, Parse = %v", got)
	}
}

func ExampleParse() {
	v, err := Parse([]byte(`{"cluster": "tollgate", "timeout_ms": 40, "attributes": [{"name": "api_key"}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	cluster, _ := v.Get("cluster")
	name, _ := cluster.Str()
	timeout, _ := v.Get("timeout_ms")
	ms, _ := timeout.Int()
	attrs, _ := v.Get("attributes")
	fmt.Println(name, ms, len(attrs.Elems()))

	_, err = Parse([]byte(`{"attributes": [{"name": "a", "name": "b"}]}`))
	fmt.Println(err)
	fmt.Println(errors.Is(err, ErrDuplicateKey))
	// Output:
	// tollgate 40 1
	// jsonv: duplicate key "name" at offset 30 (in attributes[0].name)
	// true
}

// FuzzParse checks that Parse never panics, accepts exactly what encoding/json.Valid
// accepts apart from the package's documented strictness (duplicate keys, invalid
// UTF-8, unpaired surrogates, depth), and reads what it accepts as encoding/json does.
func FuzzParse(f *testing.F) {
	for _, doc := range validDocs {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := Parse(data)
		if err != nil {
			var e *Error
			if !errors.As(err, &e) || e.Offset < 0 || e.Offset > len(data) {
				t.Fatalf("Parse(%q) error = %#v, want an *Error with an offset in the document", data, err)
			}
			if !errors.Is(err, ErrSyntax) && !errors.Is(err, ErrDuplicateKey) && !errors.Is(err, ErrTooDeep) {
				t.Fatalf("Parse(%q) error %v is none of ErrSyntax, ErrDuplicateKey, ErrTooDeep", data, err)
			}
		}
		want := json.Valid(data) && utf8.Valid(data) && !unpairedSurrogate(data) &&
			depth(data) <= MaxDepth && !duplicateKey(t, data)
		if got := err == nil; got != want {
			t.Fatalf("Parse(%q) error = %v; encoding/json says it should be accepted: %v", data, err, want)
		}
		if err != nil {
			return
		}
		if got, want := toAny(v), stdDecode(t, data); !reflect.DeepEqual(got, want) {
			t.Fatalf("Parse(%q) = %#v, encoding/json reads %#v", data, got, want)
		}
	})
}

// The helpers below hold for documents that json.Valid accepts, where a backslash
// only appears in a string and starts an escape.

// depth returns how deeply arrays and objects nest in data.
func depth(data []byte) int {
	d, most, inString := 0, 0, false
	for i := 0; i < len(data); i++ {
		switch c := data[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			d++
			most = max(most, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return most
}

// unpairedSurrogate reports whether data has a \u escape of a surrogate that is not
// part of a high-low pair.
func unpairedSurrogate(data []byte) bool {
	u := func(i int) (rune, bool) { // the \uXXXX escape at i, if any
		if i+6 > len(data) || data[i] != '\\' || data[i+1] != 'u' {
			return 0, false
		}
		var r rune
		_, err := fmt.Sscanf(string(data[i+2:i+6]), "%04x", &r)
		return r, err == nil
	}
	for i := 0; i < len(data); i++ {
		if data[i] != '\\' {
			continue
		}
		r, ok := u(i)
		switch {
		case !ok:
			i++ // a one-letter escape
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		case r >= 0xD800 && r <= 0xDBFF:
			lo, ok := u(i + 6)
			if !ok || lo < 0xDC00 || lo > 0xDFFF {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
}

// duplicateKey reports whether some object in data names a key twice, by reading it
// with encoding/json's tokenizer.
func duplicateKey(t *testing.T, data []byte) bool {
	type frame struct {
		keys      map[string]bool // nil for an array
		expectKey bool
	}
	d := json.NewDecoder(bytes.NewReader(data))
	d.UseNumber()
	var stack []*frame
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Fatalf("encoding/json cannot tokenize %q, which it calls valid: %v", data, err)
		}
		if tok == json.Delim('}') || tok == json.Delim(']') {
			stack = stack[:len(stack)-1]
			continue
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.keys != nil && top.expectKey {
			key := tok.(string)
			if top.keys[key] {
				return true
			}
			top.keys[key] = true
			top.expectKey = false
			continue
		}
		if top != nil && top.keys != nil {
			top.expectKey = true // after this value comes a key or '}'
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, expectKey: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		}
	}
}
