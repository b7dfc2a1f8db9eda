package main

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// FuzzDecodeDenyEntry checks the reader of the deny cache's shared data, which any
// plugin of the same vm_id can write: no input panics it (a panic traps the VM), and
// an entry it accepts encodes to bytes that decode to the same entry. The seed corpus
// is under testdata/fuzz/FuzzDecodeDenyEntry.
func FuzzDecodeDenyEntry(f *testing.F) {
	f.Fuzz(func(t *testing.T, b []byte) {
		e, ok := decodeDenyEntry(b)
		if !ok {
			if e != (denyEntry{}) {
				t.Fatalf("decodeDenyEntry(%q) = %+v, false; want the zero entry", b, e)
			}
			return
		}
		again, ok := decodeDenyEntry(e.encode())
		if !ok || again != e {
			t.Fatalf("decodeDenyEntry(encode(%+v)) = %+v, %v; want the same entry, true", e, again, ok)
		}
	})
}

// hostileDenyEntries are shared-data values another plugin could leave in a slot of
// the client identity: none is a live denial of it.
func hostileDenyEntries(identity string) map[string]string {
	live := strconv.FormatInt(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli(), 10)
	fields := func(f ...string) string { return strings.Join(f, "\n") }
	return map[string]string{
		"empty":                    "",
		"binary":                   "\x00\xff\xfe\n\x80",
		"version only":             "tg1",
		"nine empty fields":        "tg1\n\n\n\n\n\n\n\n",
		"other version":            fields("tg2", live, "0", identity, "r", "", "", "", ""),
		"ten fields":               fields("tg1", live, "0", identity, "r", "", "", "", "", ""),
		"until overflows":          fields("tg1", "99999999999999999999", "0", identity, "r", "", "", "", ""),
		"until not a number":       fields("tg1", "1e18", "0", identity, "r", "", "", "", ""),
		"stored not a number":      fields("tg1", live, "-", identity, "r", "", "", "", ""),
		"until the oldest int64":   fields("tg1", "-9223372036854775808", "9223372036854775807", identity, "r", "", "", "", ""),
		"another identity, live":   fields("tg1", live, "0", identity+" ", "r", "", "", "", ""),
		"identity invalid UTF-8":   fields("tg1", live, "0", "\xff"+identity, "r", "", "", "", ""),
		"a megabyte of newlines":   strings.Repeat("\n", 1<<20),
		"a megabyte in one field":  fields("tg1", live, "0", strings.Repeat("x", 1<<20), "r", "", "", "", ""),
		"version with a CR":        fields("tg1\r", live, "0", identity, "r", "", "", "", ""),
		"until with a plus sign":   fields("tg1", "+"+live, "0", identity+"x", "r", "", "", "", ""),
		"expired, far in the past": fields("tg1", "1", "0", identity, "r", `"a";r=0;t=99999999999999999999`, "", "", "x"),
	}
}

// TestDenyCacheHostileSharedData puts hostile bytes in the deny-cache slot of a
// client, as another plugin of the same vm_id could, and sends a request of that
// client: the filter must not trap, must make the callout as for an uncached client,
// and must replace the slot with its own entry when the service denies.
func TestDenyCacheHostileSharedData(t *testing.T) {
	identity := mustIdentity(t, cfg(""), []value{{"api_key", "k1"}, {"path", "/search"}})
	const slot = "tollgate.deny/public-api/0" // max_entries 1: every client's slot
	config := cfg(`"deny_cache": {"max_entries": 1}`)
	forBackends(t, func(t *testing.T, b backend) {
		// The control: a live entry of this client in that slot is a hit, so the slot
		// and the identity are the ones the filter reads.
		t.Run("control: a live entry", func(t *testing.T) {
			host, clock, setShared := startFilterWithSharedData(t, b, config)
			setShared(slot, denyEntry{identity: identity, until: clock.Now().Add(time.Minute).UnixMilli(), stored: clock.Now().UnixMilli()}.encode())
			id, _ := request(host, "k1", "/search")
			if n := len(callouts(host, id)); n != 0 {
				t.Fatalf("a live entry in %s: the request dispatched %d callouts, want 0", slot, n)
			}
			if lr := host.GetSentLocalResponse(id); lr == nil || lr.StatusCode != 429 {
				t.Fatalf("a live entry in %s: local response %+v, want 429", slot, lr)
			}
		})
		for name, v := range hostileDenyEntries(identity) {
			t.Run(name, func(t *testing.T) {
				host, _, setShared := startFilterWithSharedData(t, b, config)
				setShared(slot, []byte(v))
				id, action := request(host, "k1", "/search")
				if action != types.ActionPause || len(callouts(host, id)) != 1 {
					t.Fatalf("request with %q in its slot: %v and %d callouts, want Pause and 1 callout", name, action, len(callouts(host, id)))
				}
				if lr := host.GetSentLocalResponse(id); lr != nil {
					t.Fatalf("request with %q in its slot: local response %d, want none", name, lr.StatusCode)
				}
				answer(t, host, id, denyHeaders(), denyBody)
				id2, _ := request(host, "k1", "/search")
				if n := len(callouts(host, id2)); n != 0 {
					t.Errorf("after the service's denial over %q: %d callouts, want 0 (cached)", name, n)
				}
				wantCounters(t, host, map[string]uint64{"denied": 2, "deny_cache_hits": 1}) // a cache hit counts as denied too
			})
		}
	})
}

// mustIdentity returns the deny cache's identity of a request with attrs.
func mustIdentity(t *testing.T, config string, attrs []value) string {
	t.Helper()
	c, err := parseConfig([]byte(config))
	if err != nil {
		t.Fatalf("parseConfig: %v", err)
	}
	id, ok := c.identity(attrs)
	if !ok {
		t.Fatalf("identity(%v): no identity", attrs)
	}
	return id
}

// startFilterWithSharedData is startFilter with a function that writes the filter's
// shared data as another plugin of its vm_id would (CAS 0).
func startFilterWithSharedData(t *testing.T, b backend, config string) (filterHost, *fakeClock, func(key string, value []byte)) {
	t.Helper()
	if b == native {
		host, clock := startFilter(t, b, config)
		return host, clock, func(key string, value []byte) {
			t.Helper()
			if err := proxywasm.SetSharedData(key, value, 0); err != nil {
				t.Fatalf("SetSharedData(%q): %v", key, err)
			}
		}
	}
	clock := &fakeClock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	shared := wasmhost.NewSharedData()
	host := startWasmVM(t, config, clock, shared)
	return host, clock, shared.Set
}

// startWasmVM starts the compiled filter in a VM on shared data that other VMs may
// share, as Envoy's workers of one vm_id do.
func startWasmVM(t *testing.T, config string, clock *fakeClock, shared *wasmhost.SharedData) *wasmFilter {
	t.Helper()
	host := newWasmFilter(t, wasmhost.Options{
		PluginConfig: []byte(config),
		Properties:   map[string][]byte{"source.address": []byte(sourceAddress)},
		Clock:        clock.Now,
		Shared:       shared,
	})
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin() = %v, want OK; critical logs: %q", st, host.GetCriticalLogs())
	}
	return host
}

// TestDenyCacheSharedByVMs runs two VMs of the compiled filter on one SharedData, as
// Envoy runs one VM per worker for a vm_id: a denial VM A caches answers the client on
// VM B without a callout until its retry time. It runs on the compiled module only:
// the SDK's emulator is one host with one VM.
func TestDenyCacheSharedByVMs(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	shared := wasmhost.NewSharedData()
	a := startWasmVM(t, cfg(""), clock, shared)
	b := startWasmVM(t, cfg(""), clock, shared)

	id, _ := request(a, "k1", "/search")
	answer(t, a, id, denyHeaders(), denyBody) // retry after 16.5 s
	if lr := a.GetSentLocalResponse(id); lr == nil || lr.StatusCode != 429 {
		t.Fatalf("VM A: the service's denial sent %+v, want a local 429", lr)
	}

	clock.Advance(5 * time.Second)
	id, action := request(b, "k1", "/search")
	if n := len(callouts(b, id)); n != 0 {
		t.Fatalf("VM B: a client VM A cached dispatched %d callouts, want 0", n)
	}
	lr := b.GetSentLocalResponse(id)
	if action != types.ActionPause || lr == nil || lr.StatusCode != 429 {
		t.Fatalf("VM B: a client VM A cached: %v, local response %+v; want Pause and a local 429", action, lr)
	}
	if got := get(lr.Headers, "retry-after"); got != "12" {
		t.Errorf("VM B: cached 429 retry-after = %q, want 12 (16.5 s cached 5 s ago)", got)
	}

	id, _ = request(b, "k2", "/search")
	if n := len(callouts(b, id)); n != 1 {
		t.Errorf("VM B: another client dispatched %d callouts, want 1", n)
	}

	clock.Advance(11500 * time.Millisecond) // the retry time
	id, _ = request(b, "k1", "/search")
	if n := len(callouts(b, id)); n != 1 {
		t.Errorf("VM B: the client after its retry time dispatched %d callouts, want 1", n)
	}
	wantCounters(t, a, map[string]uint64{"denied": 1})
	wantCounters(t, b, map[string]uint64{"denied": 1, "deny_cache_hits": 1})
}
