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

// TestSharedDataCAS checks the store against Envoy's SharedData (proxy-wasm-cpp-host
// shared_data.cc): get of a missing key is NotFound; set writes a missing key whatever
// its cas, and an existing key when cas is 0 or the entry's current CAS, else
// CasMismatch and the value stays; every write gives a new, non-zero CAS.
func TestSharedDataCAS(t *testing.T) {
	t.Parallel()
	type op struct {
		set     bool
		key     string
		value   string
		cas     func(last uint32) uint32 // the cas to pass, given the last CAS read
		want    status
		wantVal string // after the op, for a get
	}
	zero := func(uint32) uint32 { return 0 }
	current := func(last uint32) uint32 { return last }
	ahead := func(last uint32) uint32 { return last + 1 }
	someCAS := func(uint32) uint32 { return 12345 }
	for _, tc := range []struct {
		name string
		ops  []op
	}{
		{"get of a missing key", []op{{key: "k", want: statusNotFound}}},
		{"missing key, cas 0", []op{{set: true, key: "k", value: "v", cas: zero, want: statusOK}, {key: "k", want: statusOK, wantVal: "v"}}},
		{"missing key, any cas", []op{{set: true, key: "k", value: "v", cas: someCAS, want: statusOK}, {key: "k", want: statusOK, wantVal: "v"}}},
		{"existing key, cas 0", []op{{set: true, key: "k", value: "v1", cas: zero, want: statusOK}, {set: true, key: "k", value: "v2", cas: zero, want: statusOK}, {key: "k", want: statusOK, wantVal: "v2"}}},
		{"existing key, current cas", []op{{set: true, key: "k", value: "v1", cas: zero, want: statusOK}, {key: "k", want: statusOK, wantVal: "v1"}, {set: true, key: "k", value: "v2", cas: current, want: statusOK}, {key: "k", want: statusOK, wantVal: "v2"}}},
		{"existing key, stale cas (read before another write)", []op{{set: true, key: "k", value: "v1", cas: zero, want: statusOK}, {key: "k", want: statusOK, wantVal: "v1"}, {set: true, key: "k", value: "v2", cas: zero, want: statusOK}, {set: true, key: "k", value: "v3", cas: current, want: statusCasMismatch}, {key: "k", want: statusOK, wantVal: "v2"}}},
		{"existing key, cas ahead", []op{{set: true, key: "k", value: "v1", cas: zero, want: statusOK}, {key: "k", want: statusOK, wantVal: "v1"}, {set: true, key: "k", value: "v2", cas: ahead, want: statusCasMismatch}, {key: "k", want: statusOK, wantVal: "v1"}}},
		{"other keys are apart", []op{{set: true, key: "a", value: "1", cas: zero, want: statusOK}, {key: "b", want: statusNotFound}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := NewSharedData()
			var last uint32
			for i, o := range tc.ops {
				if o.set {
					if got := d.set(o.key, []byte(o.value), o.cas(last)); got != o.want {
						t.Fatalf("op %d: set(%q, %q) = %d, want %d", i, o.key, o.value, got, o.want)
					}
					continue
				}
				v, cas, got := d.get(o.key)
				if got != o.want || string(v) != o.wantVal {
					t.Fatalf("op %d: get(%q) = %q, %d, want %q, %d", i, o.key, v, got, o.wantVal, o.want)
				}
				if got == statusOK && cas == 0 {
					t.Fatalf("op %d: get(%q) has CAS 0, want a non-zero CAS", i, o.key)
				}
				last = cas
			}
		})
	}

	t.Run("every write takes a new CAS", func(t *testing.T) {
		t.Parallel()
		d := NewSharedData()
		seen := map[uint32]bool{}
		for i := range 100 {
			key := []string{"a", "b"}[i%2]
			if got := d.set(key, []byte{byte(i)}, 0); got != statusOK {
				t.Fatalf("set %d = %d, want OK", i, got)
			}
			_, cas, _ := d.get(key)
			if cas == 0 || seen[cas] {
				t.Fatalf("write %d got CAS %d, want a new non-zero one", i, cas)
			}
			seen[cas] = true
		}
	})
}
