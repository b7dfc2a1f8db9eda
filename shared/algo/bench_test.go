package algo_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// The per-decision work of the decide entry's Go side: the key, the arguments,
// the reply, the headers. Run with -benchmem: every allocation here is paid on every
// decision.

var benchMeters = []algo.Meter{{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200}}}}

func BenchmarkKey(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = algo.Key("tg:", algo.Escape("client-000042"), "per-key", "", "0")
	}
}

func BenchmarkDecideArgs(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = algo.DecideArgs(benchMeters, 1, 0, false)
	}
}

func BenchmarkDecideArgsThreeMeters(b *testing.B) {
	meters := []algo.Meter{
		benchMeters[0],
		{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 10000, Period: 24 * time.Hour}}},
		{Limits: []algo.Limit{{Algorithm: algo.TokenBucket, Count: 1000, Period: time.Second, Burst: 2000}}},
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = algo.DecideArgs(meters, 1, 0, false)
	}
}

func BenchmarkParseDecideReply(b *testing.B) {
	// As go-redis returns it: int64 elements.
	reply := []any{int64(1763800000123456), int64(1), int64(1), int64(199), int64(10000), int64(0), int64(0)}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := algo.ParseDecideReply(reply, benchMeters); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkHeaders(b *testing.B) {
	qs := []algo.Quota{{
		Name:     "per-key",
		Limit:    algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200},
		Decision: algo.Decision{Allowed: true, Limit: 100, Period: time.Second, Remaining: 199, ResetAfter: 10 * time.Millisecond},
	}}
	b.ReportAllocs()
	for b.Loop() {
		_ = algo.Headers(qs, 0)
	}
}

func BenchmarkStepGCRA(b *testing.B) {
	m := benchMeters[0]
	var s algo.State
	now := time.Now().UnixMicro()
	b.ReportAllocs()
	for b.Loop() {
		now += 10000
		s, _ = m.StepMicros(s, now, 1)
	}
}
