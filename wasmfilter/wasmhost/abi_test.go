package wasmhost

import (
	"reflect"
	"testing"
)

func TestHeaderMapRoundTrip(t *testing.T) {
	t.Parallel()
	for _, hs := range [][][2]string{
		nil,
		{{":status", "200"}},
		{{"a", ""}, {"", "b"}, {"x-nul", "v\x00w"}, {"k", "é\xff"}},
	} {
		got, ok := decodeMap(encodeMap(hs))
		if !ok || len(got) != len(hs) || (len(hs) > 0 && !reflect.DeepEqual(got, hs)) {
			t.Errorf("decodeMap(encodeMap(%q)) = %q, %v; want %q, true", hs, got, ok, hs)
		}
	}
}

func TestDecodeMapRejects(t *testing.T) {
	t.Parallel()
	for _, b := range [][]byte{
		{1, 0, 0},                            // short count
		{1, 0, 0, 0},                         // one pair, no sizes
		{1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0}, // key size past the end
		{255, 255, 255, 255, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
	} {
		if got, ok := decodeMap(b); ok {
			t.Errorf("decodeMap(%v) = %q, true; want false", b, got)
		}
	}
}

// FuzzDecodeMap checks that no serialized header map the guest sends panics the host,
// and that what decodes encodes back to a map that decodes the same.
func FuzzDecodeMap(f *testing.F) {
	f.Add(encodeMap([][2]string{{":status", "200"}, {"retry-after", "1"}}))
	f.Add([]byte{2, 0, 0, 0, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		hs, ok := decodeMap(b)
		if !ok {
			return
		}
		again, ok := decodeMap(encodeMap(hs))
		if !ok || len(again) != len(hs) || (len(hs) > 0 && !reflect.DeepEqual(again, hs)) {
			t.Errorf("decodeMap(encodeMap(%q)) = %q, %v", hs, again, ok)
		}
	})
}
