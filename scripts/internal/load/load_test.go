package load

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestRun checks that the window counts exactly the calls made in it when Hold
// parked the workers before it, that every call of the window is timed, and that
// the workers go round the clients evenly.
func TestRun(t *testing.T) {
	t.Parallel()
	const workers, clients = 3, 7
	var mu sync.Mutex
	perClient := make([]int, clients)
	measuring := false
	fail := errors.New("client 5 fails")
	op := func(ctx context.Context, w, i int) error {
		if w < 0 || w >= workers || i < 0 || i >= clients {
			t.Errorf("op(ctx, %d, %d): want a worker below %d, a client below %d", w, i, workers, clients)
		}
		mu.Lock()
		if measuring {
			perClient[i]++
		}
		mu.Unlock()
		time.Sleep(100 * time.Microsecond)
		if i == 5 {
			return fail
		}
		return nil
	}
	run := Start(context.Background(), Options{Workers: workers, Clients: clients}, op)
	time.Sleep(5 * time.Millisecond)
	run.Hold()
	mu.Lock()
	measuring = true
	mu.Unlock()
	run.Measure()
	time.Sleep(30 * time.Millisecond)
	res := run.Stop()
	if again := run.Stop(); again.Calls != res.Calls || again.Latency.TotalCount() != res.Calls {
		t.Errorf("Stop() again = %d calls, %d timed, want the first result's %d", again.Calls, again.Latency.TotalCount(), res.Calls)
	}

	total := 0
	for _, n := range perClient {
		total += n
	}
	if int64(total) != res.Calls {
		t.Errorf("Stop().Calls = %d, the op saw %d calls in the window", res.Calls, total)
	}
	if res.Calls == 0 || res.Latency.TotalCount() != res.Calls {
		t.Errorf("Stop() = %d calls, %d timed, want some and all", res.Calls, res.Latency.TotalCount())
	}
	if lo, hi := minMax(perClient); hi-lo > workers {
		t.Errorf("calls per client %v, want within %d of each other", perClient, workers)
	}
	if res.Errors == 0 || res.Errors > (res.Calls+clients-1)/clients+workers || !errors.Is(res.FirstErr, fail) {
		t.Errorf("Stop() = %d errors (first %v) of %d calls, want about one in %d, %v", res.Errors, res.FirstErr, res.Calls, clients, fail)
	}
	if res.Elapsed < 30*time.Millisecond || res.Rate() <= 0 {
		t.Errorf("Stop() = %v elapsed, rate %v, want at least 30ms and a rate", res.Elapsed, res.Rate())
	}
}

// TestStopUnmeasured checks that a run stopped before its window opened reports
// nothing, that a done context stops the workers, and that Hold does not wait for
// workers that have returned.
func TestStopUnmeasured(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	run := Start(ctx, Options{}, func(context.Context, int, int) error { return nil })
	cancel()
	run.Hold()
	if res := run.Stop(); res.Calls != 0 || res.Elapsed != 0 || res.Rate() != 0 {
		t.Errorf("Stop() = %+v, want no calls, no time, rate 0", res)
	}
}

func TestMedian(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{9, 1, 5}, 5},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(tt.xs); got != tt.want {
			t.Errorf("Median(%v) = %v, want %v", tt.xs, got, tt.want)
		}
	}
}

func minMax(xs []int) (lo, hi int) {
	lo, hi = xs[0], xs[0]
	for _, x := range xs {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}
