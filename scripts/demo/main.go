// Command demo fires a scripted burst of requests at a running decision service and
// prints, per rule of the default policy, the cost each request sends, how many were
// allowed and denied, and a short form of the first and last answers, in at most 100
// columns.
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"text/tabwriter"
	"time"
)

// scenario is one burst against one rule of lambda/policy.yaml.
type scenario struct {
	rule  string
	n     int
	attrs map[string]string
	cost  int
}

var scenarios = []scenario{
	{"login-per-ip", 8, map[string]string{"remote_address": "203.0.113.7", "path": "/login", "user": "alice"}, 1},
	{"per-key", 400, map[string]string{"api_key": "demo-key-1", "path": "/items"}, 1},
	{"uploads", 25, map[string]string{"api_key": "demo-key-2", "path": "/upload"}, 1},
	{"search-global", 5, map[string]string{"path": "/search"}, 500},
	{"ip-tiers (shadow)", 3, map[string]string{"remote_address": "198.51.100.9", "path": "/"}, 400},
}

func main() {
	url := flag.String("url", "http://127.0.0.1:8080", "the decision service")
	domain := flag.String("domain", "public-api", "the policy's domain")
	flag.Parse()
	client := &http.Client{Timeout: 2 * time.Second}
	if _, err := client.Get(*url + "/healthz"); err != nil {
		fmt.Fprintf(os.Stderr, "demo: no decision service at %s (%v); start one with `make run`\n", *url, err)
		os.Exit(1)
	}
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "rule\tcost\tsent\tallowed\tdenied\tdelayed\tshadow\tfirst answer\tlast answer")
	for _, s := range scenarios {
		var allowed, denied, delayed, shadowDenied int
		var first, last string
		for i := range s.n {
			body, _ := json.Marshal(map[string]any{"domain": *domain, "attributes": s.attrs, "cost": s.cost})
			resp, err := client.Post(*url+"/v1/check", "application/json", bytes.NewReader(body))
			if err != nil {
				fmt.Fprintf(os.Stderr, "demo: %v\n", err)
				os.Exit(1)
			}
			var verdict struct {
				Limits []struct {
					Allowed bool `json:"allowed"`
					Shadow  bool `json:"shadow"`
				} `json:"limits"`
			}
			json.NewDecoder(resp.Body).Decode(&verdict)
			resp.Body.Close()
			for _, l := range verdict.Limits {
				if l.Shadow && !l.Allowed {
					shadowDenied++
					break
				}
			}
			switch resp.StatusCode {
			case http.StatusOK:
				allowed++
			case http.StatusTooManyRequests:
				denied++
			default:
				fmt.Fprintf(os.Stderr, "demo: unexpected status %d\n", resp.StatusCode)
				os.Exit(1)
			}
			if resp.Header.Get("X-Tollgate-Delay-Ms") != "" {
				delayed++
			}
			h := summary(resp)
			if i == 0 {
				first = h
			}
			last = h
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", s.rule, s.cost, s.n, allowed, denied, delayed, shadowDenied, first, last)
	}
	tw.Flush()
	fmt.Println("\nshadow: answers a shadow limit would have denied (it never does). An answer is the")
	fmt.Println("status, the deciding limit's remaining units (left) and, when denied, Retry-After.")
}

// summary is a short form of an answer: its status, the deciding limit's remaining
// units and, when denied or delayed, how long to wait.
func summary(r *http.Response) string {
	parts := []string{fmt.Sprint(r.StatusCode)}
	if v := r.Header.Get("X-RateLimit-Remaining"); v != "" {
		parts = append(parts, "left "+v)
	}
	if v := r.Header.Get("Retry-After"); v != "" {
		parts = append(parts, "retry "+v+"s")
	}
	if v := r.Header.Get("X-Tollgate-Delay-Ms"); v != "" {
		parts = append(parts, "delay "+v+"ms")
	}
	return strings.Join(parts, " ")
}
