package policy_test

import (
	"fmt"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

func ExamplePolicy_Match() {
	p, err := policy.Parse([]byte(`
domain: public-api
shard_by: api_key
rules:
  - name: per-key
    match: {api_key: "*"}
    limits:
      - {algorithm: gcra, rate: 100/s, burst: 200}
      - {algorithm: fixed_window, rate: 10000/day}
  - name: uploads
    match: {api_key: "*", path: /upload}
    limits:
      - {algorithm: leaky_bucket, rate: 10/s, burst: 20}
  - name: login-per-ip
    match: {remote_address: "*", path: /login}
    limits:
      - {algorithm: sliding_log, rate: 5/min, record: user}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range p.Match(map[string]string{"api_key": "k1", "path": "/upload", "remote_address": "203.0.113.9"}) {
		for _, mm := range m.Meters {
			fmt.Println(m.Rule.Name, mm.Key, mm.Meter.Limits)
		}
	}
	// Output:
	// per-key tg:{k1}per-key::0.c5936300 [gcra 100/s burst 200]
	// per-key tg:{k1}per-key::0.0c8a238f [fixed_window 10000/d]
	// uploads tg:{k1}uploads:/upload:0.413c6940 [leaky_bucket 10/s burst 20]
}

func ExampleParse_errors() {
	_, err := policy.Parse([]byte(`
domain: public-api
rules:
  - name: per-key
    limits:
      - {algorithm: sliding_log, rate: 5/x, burst: 10}
  - name: per-key
    limits:
      - {algorithm: gcra, rate: 100/s, colour: red}
`))
	fmt.Println(err)
	// Output:
	// policy: 4 problems:
	//	rules[0].limits[0].rate: "5/x": unknown unit "x"; use ms, s, min, h, day, week or month (line 6)
	//	rules[0].limits[0].burst: "10": sliding_log has no burst; remove it or use token_bucket, gcra or leaky_bucket (line 6)
	//	rules[1].name: "per-key" is used by rules[0]; rule names must be unique (line 7)
	//	rules[1].limits[0].colour: unknown field; known fields: algorithm, rate, burst, bucket, record, calendar, lease, replicas, counter (line 9)
}

// A hot global limit served from leases: each instance reserves 50 units at a time
// and spends them in process for at most 100ms. A lease on an algorithm that cannot
// lease is a problem with its fix.
func ExampleLease() {
	p, err := policy.Parse([]byte(`
domain: public-api
rules:
  - name: search-global
    match: {path: "/search*"}
    limits:
      - {algorithm: fixed_window, rate: 1000/s, lease: {units: 50, for: 100ms}}
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%+v\n", p.Rules[0].Meters[0].Lease)
	_, err = policy.Parse([]byte(`
domain: public-api
rules:
  - name: login
    limits: [{algorithm: sliding_log, rate: 5/min, lease: {units: 2, for: 1s}}]
`))
	fmt.Println(err)
	// Output:
	// {Units:50 For:100ms}
	// policy: rules[0].limits[0].lease: sliding_log cannot lease (each request must reach the store); remove lease or use fixed_window, sliding_window, token_bucket or gcra (line 5)
}
