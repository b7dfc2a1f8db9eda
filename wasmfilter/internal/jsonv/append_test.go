package jsonv

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
)

// escapable are string pieces that encoding/json escapes or replaces, mixed with
// plain ones.
var escapable = []string{
	"", "a", "public-api", " ", "/", "'", "\"", "\\", "\\\"", "\x00", "\x01", "\b", "\f",
	"\n", "\r", "\t", "\x0b", "\x1f", "\x7f", "<", ">", "&", "</script>", "\u2028", "\u2029",
	"\u2027", "\u202a", "é", "日本", "\U0001F600", "\ufffd", "\xff", "\xfe\xff", "\xc3",
	"\xe2\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "\x80",
}

// checkAppendString fails t unless AppendString writes what encoding/json writes for
// s: json.Marshal with escapeHTML, an Encoder with SetEscapeHTML(false) without.
func checkAppendString(t *testing.T, s string) {
	t.Helper()
	want, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if got := AppendString([]byte("x"), s, true); string(got) != "x"+string(want) {
		t.Errorf("AppendString(%q, escapeHTML) = %s, want x and %s", s, got, want)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(s); err != nil {
		t.Fatal(err)
	}
	want = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	if got := AppendString([]byte("x"), s, false); string(got) != "x"+string(want) {
		t.Errorf("AppendString(%q) = %s, want x and %s", s, got, want)
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	var all strings.Builder
	for _, s := range escapable {
		all.WriteString(s)
		checkAppendString(t, s)
	}
	for c := range 256 { // every byte alone
		checkAppendString(t, string([]byte{byte(c)}))
	}
	checkAppendString(t, all.String())
}

func FuzzAppendString(f *testing.F) {
	for _, s := range escapable {
		f.Add(s)
	}
	f.Fuzz(checkAppendString)
}
