package algo_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

func ExampleParseRate() {
	for _, s := range []string{"100/s", "5/10s", "30/min", "10000/day", "1/500ms", "10/x"} {
		count, period, err := algo.ParseRate(s)
		if err != nil {
			fmt.Println(err)
			continue
		}
		fmt.Println(count, period, algo.FormatRate(count, period))
	}
	// Output:
	// 100 1s 100/s
	// 5 10s 5/10s
	// 30 1m0s 30/min
	// 10000 24h0m0s 10000/d
	// 1 500ms 1/500ms
	// rate: "10/x": unknown unit "x"; use ms, s, min, h or day
}

func ExampleMeter_Step() {
	// Two requests per second, and a burst of two.
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 2, Period: time.Second, Burst: 2}}}
	if err := m.Validate(); err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	var st algo.State // the empty state: a key never seen
	for range 3 {
		var ds []algo.Decision
		st, ds = m.Step(st, now, 1) // a denial returns st unchanged
		d := ds[0]
		fmt.Printf("allowed=%v remaining=%d retry-after=%v reset-after=%v\n", d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter)
	}
	// Output:
	// allowed=true remaining=1 retry-after=0s reset-after=500ms
	// allowed=true remaining=0 retry-after=0s reset-after=1s
	// allowed=false remaining=0 retry-after=500ms reset-after=1s
}

func ExampleHeaders() {
	perMinute := algo.Quota{
		Name:  "per-key",
		Limit: algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Minute},
		Decision: algo.Decision{Allowed: false, Limit: 100, Period: time.Minute, Remaining: 0,
			ResetAfter: 17 * time.Second, RetryAfter: 2500 * time.Millisecond},
	}
	// A token bucket of 10/s with a burst of 50 states its burst over the 5s the rate
	// takes to refill it.
	bucket := algo.Quota{
		Name:     "search",
		Limit:    algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Second, Burst: 50},
		Decision: algo.Decision{Allowed: true, Limit: 10, Period: time.Second, Remaining: 41, ResetAfter: 900 * time.Millisecond},
	}
	for _, h := range algo.Headers([]algo.Quota{perMinute, bucket}, 0) {
		fmt.Printf("%s: %s\n", h[0], h[1])
	}
	// Output:
	// RateLimit-Policy: "per-key";q=100;w=60, "search";q=50;w=5
	// RateLimit: "per-key";r=0;t=17, "search";r=41;t=1
	// X-RateLimit-Limit: 100
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Reset: 17
	// Retry-After: 3
}

func ExampleKey() {
	// Every key of one client address shares its hash tag, so one script can decide
	// all of them in Redis Cluster.
	tag := algo.Escape("203.0.113.7")
	login := algo.Key("tg:", tag, "login", algo.Escape("alice@example.com"), "0")
	api := algo.Key("tg:", tag, "api", algo.Escape("GET /v1/{id}"), "1")
	fmt.Println(login)
	fmt.Println(api)
	fmt.Println(algo.HashTag(api), algo.Slot(login) == algo.Slot(api))
	// Output:
	// tg:{203.0.113.7}login:alice@example.com:0
	// tg:{203.0.113.7}api:GET%20/v1/%7Bid%7D:1
	// 203.0.113.7 true
}

func ExampleEscape() {
	fmt.Println(algo.Escape("alice@example.com"))
	fmt.Println(algo.Escape("2001:db8::{1}"))
	fmt.Println(algo.Escape("") == "%")
	fmt.Println(len(algo.Escape(string(make([]byte, 200)))))
	// Output:
	// alice@example.com
	// 2001%3Adb8%3A%3A%7B1%7D
	// true
	// 65
}

func ExampleMeter_Settle() {
	// A tenant's 1000 tokens a minute, refilled continuously.
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.TokenBucket, Count: 1000, Period: time.Minute}}}
	now := time.Date(2024, 1, 1, 12, 0, 0, 0, time.UTC)
	var st algo.State
	st, ds := m.Step(st, now, 900) // the request's estimate, decided as usual
	fmt.Println("check 900:", ds[0].Allowed, "remaining", ds[0].Remaining)
	_, ds = m.Step(st, now, 200) // a plain charge of 200 does not fit, and charges nothing
	fmt.Println("charge 200:", ds[0].Allowed)
	st, ds, err := m.Settle(st, now, 200) // the response's 200 tokens were spent: settle them
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("settle 200:", ds[0].Allowed, "remaining", ds[0].Remaining, "full again in", ds[0].ResetAfter)
	_, ds = m.Step(st, now, 1) // a debt of 100: paid back at 1000 a minute
	fmt.Println("next check:", ds[0].Allowed, "retry in", ds[0].RetryAfter)
	_, ds = m.Step(st, now.Add(ds[0].RetryAfter), 1)
	fmt.Println("after the retry:", ds[0].Allowed)
	_, _, err = algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 10, Period: time.Minute}}}.Settle(algo.State{}, now, 20)
	fmt.Println(errors.Is(err, algo.ErrCannotSettle))
	// Output:
	// check 900: true remaining 100
	// charge 200: false
	// settle 200: true remaining 0 full again in 1m6s
	// next check: false retry in 6.06s
	// after the retry: true
	// true
}
