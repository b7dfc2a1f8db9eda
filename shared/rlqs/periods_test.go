package rlqs_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/internal/envoyrlqs"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// periodLimit is one fixed_window limit of a periods test: count per period.
type periodLimit struct {
	count  int64
	period time.Duration
}

func (l periodLimit) String() string { return fmt.Sprintf("%d/%s", l.count, l.period) }

// periodsPolicy is a policy whose rlqs rules all match every tenant and report
// every second: one rule with every limit when together, else one rule a limit.
func periodsPolicy(limits []periodLimit, together bool) string {
	var b strings.Builder
	b.WriteString("domain: fleet\nfailure: {timeout: 2s}\nrules:\n")
	rule := func(name string, ls []periodLimit) {
		fmt.Fprintf(&b, "  - {name: %s, match: {tenant: \"*\"}, rlqs: {reporting_interval: 1s}, limits: [", name)
		for i, l := range ls {
			if i > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "{algorithm: fixed_window, rate: %s}", l)
		}
		b.WriteString("]}\n")
	}
	if together {
		rule("r", limits)
	} else {
		for i, l := range limits {
			rule(fmt.Sprintf("r%d", i), []periodLimit{l})
		}
	}
	return b.String()
}

// runPeriods runs one simulated Envoy per rate, alternately on two instances
// sharing the Redis at url, for the time given, and returns what they admitted
// together in each second (Unix seconds).
func runPeriods(t *testing.T, b backend, url, doc string, rates []float64, d time.Duration) map[int64]int64 {
	t.Helper()
	c1, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
	c2, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
	var envoys []*envoyrlqs.Envoy
	for i := range rates {
		c := c1
		if i%2 == 1 {
			c = c2
		}
		envoys = append(envoys, newEnvoy(t, c, "e", time.Second))
	}
	drive(envoys, rates, time.Now().Add(d))
	total := map[int64]int64{}
	for _, m := range admittedBy(t, envoys) {
		for s, n := range m {
			total[s] += n
		}
	}
	return total
}

// windows sums per-second admissions into l's windows, and returns them with
// the indices of the first and last windows the run covered in full.
func windows(perSecond map[int64]int64, l periodLimit) (map[int64]int64, int64, int64) {
	p := int64(l.period / time.Second)
	out := map[int64]int64{}
	first, last := int64(-1), int64(-1)
	for s, n := range perSecond {
		out[s/p] += n
		if first < 0 || s < first {
			first = s
		}
		if s > last {
			last = s
		}
	}
	// The first and last seconds may be partial: a full window starts after the
	// first and ends by the start of the last.
	return out, (first + p) / p, last/p - 1
}

// TestPeriods shares two limits of different periods on one bucket, 100 per 2s
// and 300 per 10s (each longer period a multiple of the shorter, with a larger
// count: what the policy accepts), in two rules and in one, among three Envoys
// asking 300 requests per second together, on two instances: no window of either
// limit admits more than its count, and every full 10s window admits all 300 (the
// bucket is not under-served: its grants follow the 2s windows, 100 each, until
// the 10s window is spent).
func TestPeriods(t *testing.T) {
	limits := []periodLimit{{100, 2 * time.Second}, {300, 10 * time.Second}}
	for _, b := range backends {
		for _, together := range []bool{false, true} {
			name := b.name + "/two rules"
			if together {
				name = b.name + "/one rule"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel() // each has its own Redis; the run is wall-clock time
				per := runPeriods(t, b, b.start(t), periodsPolicy(limits, together), []float64{150, 100, 50}, 32*time.Second)
				for _, l := range limits {
					ws, first, last := windows(per, l)
					var full []int64
					for w, n := range ws {
						if n > l.count {
							t.Errorf("%s: window %d admitted %d, over its count", l, w, n)
						}
					}
					for w := first; w <= last; w++ {
						full = append(full, ws[w])
					}
					t.Logf("%s: full windows admitted %v", l, full)
				}
				long := limits[1]
				ws, first, last := windows(per, long)
				if last < first {
					t.Fatalf("no full %s window in the run", long.period)
				}
				for w := first; w <= last; w++ {
					if ws[w] != long.count {
						t.Errorf("%s: full window %d admitted %d, want %d (demand is 10 times the limit)", long, w, ws[w], long.count)
					}
				}
			})
		}
	}
}
