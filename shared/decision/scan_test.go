package decision

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"unicode/utf8"
)

// checkParse fails t unless ParseCheckRequest answers body as encoding/json alone
// does, and unless scanCheckRequest, when it decodes valid UTF-8, decodes it as
// encoding/json does. It returns whether scanCheckRequest decoded it.
func checkParse(t *testing.T, body []byte) bool {
	t.Helper()
	req, perr := parseCheckRequest(body, true)
	wantReq, wantErr := parseCheckRequest(body, false)
	if !reflect.DeepEqual(req, wantReq) || !reflect.DeepEqual(perr, wantErr) {
		t.Fatalf("ParseCheckRequest(%q) = %#v, %#v; encoding/json gives %#v, %#v", body, req, perr, wantReq, wantErr)
	}
	if !utf8.Valid(body) { // parseCheckRequest rejects it before scanning
		return false
	}
	cf, ok := scanCheckRequest(body)
	if ok {
		want, perr := decodeCheckRequest(body)
		if perr != nil || !reflect.DeepEqual(cf, want) {
			t.Fatalf("scanCheckRequest(%q) = %#v, true; decodeCheckRequest gives %#v, %#v", body, cf, want, perr)
		}
	}
	return ok
}

var parseBodies = []struct {
	body    string
	scanned bool // scanCheckRequest decodes it; else encoding/json does
}{
	{`{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"},"cost":1}`, true},
	{`{"domain":"test","attributes":{"api_key":"{x}:y","path":"/both"}}`, true},
	{`{"domain":"test","attributes":{"path_with_query":"/search?q=a&page=2"}}`, true},
	{` { "cost" : 0 , "attributes" : { } , "domain" : "test" } ` + "\n\t\r", true},
	{`{"domain":"test","attributes":{"a":"1","a":"2"}}`, true},
	{`{"domain":"test","attributes":{"":""},"cost":-42}`, true},
	{`{"domain":"test","cost":999999999999999999}`, true},
	{`{"domain":"test","cost":-999999999999999999}`, true},
	{`{"domain":"test","cost":1048577}`, true},
	{`{"domain":"t\u00e9st","attributes":{"k":"日本\u2028<&>"}}`, false},
	{"{\"domain\":\"t\u00e9st\",\"attributes\":{\"k\":\"日本\u2028<&>\"}}", true},
	{`{"domain":""}`, true},
	{`{}`, true},
	{`{"attributes":{}}`, true},
	{`{"domain":"test"} }`, false},
	{`{"domain":"test"}]`, false},
	{`{"domain":"test"} {}`, false},
	{`{"domain":"test"} x`, false},
	{`{"domain":"test"`, false},
	{`{"domain":"test",}`, false},
	{`{"domain":"test" "cost":1}`, false},
	{`{"domain" "test"}`, false},
	{`{"Domain":"test"}`, false},
	{`{"DOMAIN":"test","domain":"x"}`, false},
	{`{"domain":"a","domain":"b"}`, false},
	{`{"domain":"a","attributes":{"x":"1"},"attributes":{"y":"2"}}`, false},
	{`{"domain":"a","cost":1,"cost":2}`, false},
	{`{"domain":null}`, false},
	{`{"domain":"test","attributes":null}`, false},
	{`{"domain":"test","cost":null}`, false},
	{`{"domain":5}`, false},
	{`{"domain":"test","attributes":{"a":null}}`, false},
	{`{"domain":"test","attributes":{"a":5}}`, false},
	{`{"domain":"test","attributes":["a"]}`, false},
	{`{"domain":"test","attributes":{"a":"b",}}`, false},
	{`{"domain":"test","attributes":{"a" "b"}}`, false},
	{`{"domain":"test","attributes":{"a":"b"`, false},
	{`{"domain":"test","cost":1e99}`, false},
	{`{"domain":"test","cost":1.0}`, false},
	{`{"domain":"test","cost":1E2}`, false},
	{`{"domain":"test","cost":-0}`, false},
	{`{"domain":"test","cost":01}`, false},
	{`{"domain":"test","cost":-}`, false},
	{`{"domain":"test","cost":+1}`, false},
	{`{"domain":"test","cost":"1"}`, false},
	{`{"domain":"test","cost":9999999999999999999}`, false},
	{`{"domain":"test","cost":99999999999999999999999}`, false},
	{`{"domain":"test","colour":1}`, false},
	{`{"domain":"te\"st"}`, false},
	{`{"domain":"te\\st"}`, false},
	{"{\"domain\":\"te\nst\"}", false},
	{"{\"domain\":\"te\x00st\"}", false},
	{"{\"domain\":\"test\"}\x00", false},
	{"{\"domain\":\"test\"}\v", false},
	{"\ufeff{\"domain\":\"test\"}", false},
	{`{"domain":"test"}` + strings.Repeat(" ", 10), true},
	{``, false},
	{` `, false},
	{`[1,2]`, false},
	{`null`, false},
	{`"domain"`, false},
	{`{`, false},
	{`}`, false},
	{"\xff", false},
	{"{\"domain\":\"test\",\"attributes\":{\"api_key\":\"\xff\xfe\"}}", false},
}

func TestScanCheckRequestMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range parseBodies {
		if got := checkParse(t, []byte(tc.body)); got != tc.scanned {
			t.Errorf("scanCheckRequest(%q) ok = %v, want %v", tc.body, got, tc.scanned)
		}
	}
	many := []byte(`{"domain":"test","attributes":{`)
	for i := range 70 {
		if i > 0 {
			many = append(many, ',')
		}
		many = append(many, `"a`...)
		many = append(many, byte('0'+i/10), byte('0'+i%10))
		many = append(many, `":"v"`...)
		if i == 63 || i == 64 {
			if !checkParse(t, append(bytes.Clone(many), "}}"...)) {
				t.Errorf("scanCheckRequest of %d attributes failed, want it to decode them", i+1)
			}
		}
	}
	long := `{"domain":"test","attributes":{"api_key":"` + strings.Repeat("x", 1025) + `"}}`
	if !checkParse(t, []byte(long)) {
		t.Errorf("scanCheckRequest of a long value failed, want it to decode it")
	}
	checkParse(t, []byte(`{"domain":"test","attributes":{"a":"`+strings.Repeat("x", MaxBody)+`"}}`))
}

// FuzzParseCheckRequest checks that ParseCheckRequest, with its scanner, answers
// every body as encoding/json alone does.
func FuzzParseCheckRequest(f *testing.F) {
	for _, tc := range parseBodies {
		f.Add([]byte(tc.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkParse(t, body)
	})
}

func TestReadBodyMatchesReadAll(t *testing.T) {
	t.Parallel()
	boom := errors.New("boom")
	readers := map[string]func([]byte) io.Reader{
		"plain":    func(b []byte) io.Reader { return bytes.NewReader(b) },
		"one byte": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"data+EOF": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
		"half":     func(b []byte) io.Reader { return iotest.HalfReader(bytes.NewReader(b)) },
		"error":    func(b []byte) io.Reader { return io.MultiReader(bytes.NewReader(b), iotest.ErrReader(boom)) },
	}
	for name, reader := range readers {
		for _, n := range []int{0, 1, 511, 512, 1023, 1024, 1025, 4000, MaxBody, MaxBody + 1, MaxBody + 2, 3 * MaxBody} {
			for _, c := range []int{0, 1024} {
				data := bytes.Repeat([]byte("0123456789"), n/10+1)[:n]
				want, wantErr := io.ReadAll(io.LimitReader(reader(data), MaxBody+1))
				got, err := readBody(make([]byte, 0, c), reader(data))
				if !bytes.Equal(got, want) || err != wantErr {
					t.Errorf("readBody(%s reader of %d bytes, cap %d) = %d bytes, %v; want %d bytes, %v", name, n, c, len(got), err, len(want), wantErr)
				}
			}
		}
	}
}
