package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

const policyUsage = `usage:
  limiter policy check FILE...
      lists every problem of each policy file; exit status 1 if any has one
  limiter policy explain [--redis URL] [--cluster] FILE [ATTRIBUTE=VALUE...]
      shows which rules a request with these attributes matches (and why the others
      do not), every key with its Redis Cluster slot, and, with --redis, what each
      limit would answer now, without charging anything. The service logs its
      embedded Redis's URL at start ("embedded Redis listening").
Flags may come before or after the file; each command takes --help.
`

// policyCommand runs `limiter policy ARGS`, writing to out, and returns the exit
// status: 0, 1 for an invalid policy, 2 for a usage error.
func policyCommand(ctx context.Context, args []string, out io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(out, policyUsage)
		return 2
	}
	var err error
	switch args[0] {
	case "check":
		var files []string
		files, err = parseInterleaved(policyFlags("check"), args[1:])
		if err == nil && len(files) == 0 {
			err = usageError{errors.New("policy check: name at least one policy file")}
		}
		if err == nil {
			return checkPolicies(files, out)
		}
	case "explain":
		err = explain(ctx, args[1:], out)
	case "help", "-h", "-help", "--help":
		fmt.Fprint(out, policyUsage)
		return 0
	default:
		fmt.Fprintf(out, "unknown policy command %q\n%s", args[0], policyUsage)
		return 2
	}
	var ve *policy.ValidationError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(out, policyUsage)
		if args[0] == "explain" {
			fmt.Fprintln(out, "\nflags of policy explain:")
			printFlags(out, explainFlags(new(string), new(bool)))
		}
		return 0
	case errors.As(err, &ve):
		fmt.Fprintln(out, err)
		return 1
	}
	fmt.Fprintf(out, "%v\n", err)
	if _, ok := errors.AsType[usageError](err); ok {
		fmt.Fprint(out, policyUsage)
	}
	return 2
}

// policyFlags is the flag set of `limiter policy NAME`, writing nothing itself.
func policyFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("policy "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// explainFlags is the flag set of `limiter policy explain`, setting url and cluster.
func explainFlags(url *string, cluster *bool) *flag.FlagSet {
	fs := policyFlags("explain")
	fs.StringVar(url, "redis", "", "read each limit's current state, never charging it, from the Redis at `URL` (the service logs its embedded Redis's URL at start)")
	fs.BoolVar(cluster, "cluster", false, "the Redis is a Redis Cluster")
	return fs
}

// parseInterleaved parses args with fs, flags before and after the words, and
// returns the words: `policy explain FILE --redis URL` reads as `policy explain
// --redis URL FILE`. After "--" every argument is a word. A flag error is a
// usageError; -h and --help return flag.ErrHelp.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var words []string
	for {
		// fs.Parse stops at the first word, and after "--", which it drops.
		dashes := slices.Index(args, "--")
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usageError{fmt.Errorf("%s: %w", fs.Name(), err)}
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return words, nil
		}
		if dashes >= 0 && len(args)-dashes-1 == len(rest) {
			return append(words, rest...), nil
		}
		words, args = append(words, rest[0]), rest[1:]
	}
}

// checkPolicies validates each file and prints its problems, or a summary.
func checkPolicies(files []string, out io.Writer) int {
	status := 0
	for _, f := range files {
		p, err := policy.Load(f)
		if err != nil {
			fmt.Fprintln(out, err)
			status = 1
			continue
		}
		fmt.Fprintf(out, "%s: ok: domain %q, %d rules, failure mode %s\n", f, p.Domain, len(p.Rules), p.Failure.Mode)
	}
	return status
}

// explain prints what the policy in args' file does with the request args describe.
func explain(ctx context.Context, args []string, out io.Writer) error {
	url, cluster := new(string), new(bool)
	fs := explainFlags(url, cluster)
	words, err := parseInterleaved(fs, args)
	if err != nil {
		return err
	}
	if len(words) < 1 {
		return usageError{errors.New("policy explain: name a policy file")}
	}
	p, err := policy.Load(words[0])
	if err != nil {
		return err
	}
	attrs := map[string]string{}
	for _, kv := range words[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return fmt.Errorf("policy explain: %q: want ATTRIBUTE=VALUE, e.g. api_key=k-123 or path=/login", kv)
		}
		attrs[k] = v
	}
	// explain reads the state; it decides nothing, so the policy's decision budget
	// (50ms by default) does not bound it: a slow Redis gets 5s, as the peek below.
	p.Failure.Timeout = max(p.Failure.Timeout, explainTimeout)
	cfg := engine.Config{Policy: p, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if *url != "" {
		st, err := redisstore.Open(redisstore.Config{URL: *url, Cluster: *cluster, Timeout: explainTimeout})
		if err != nil {
			return err
		}
		defer st.Close()
		cfg.Store = st
	}
	eng, err := engine.New(cfg)
	if err != nil {
		return err
	}
	plan, err := eng.Plan(engine.Request{Domain: p.Domain, Attributes: attrs})
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "domain %s, request %s\n", p.Domain, formatAttrs(attrs))
	if plan.Client != "" {
		fmt.Fprintf(out, "client address: %s", plan.Client)
		if plan.AddressFellBack {
			fmt.Fprint(out, " (the trusted X-Forwarded-For entry was unusable)")
		}
		fmt.Fprintln(out)
	}
	if pl := p.Plans; pl != nil {
		if name := plan.Attributes[pl.Attribute]; name != "" {
			fmt.Fprintf(out, "%s: %s (from the policy's plans, by %s)\n", pl.Attribute, name, pl.From)
		} else if _, ok := plan.Attributes[pl.From]; !ok {
			fmt.Fprintf(out, "no %s: the request has no %s to look up\n", pl.Attribute, pl.From)
		} else {
			fmt.Fprintf(out, "no %s: %s is not in the policy's plans, which set no default\n", pl.Attribute, pl.From)
		}
	}
	var v engine.Verdict
	if *url != "" {
		pctx, cancel := context.WithTimeout(ctx, explainTimeout)
		v, err = eng.Peek(pctx, plan)
		cancel()
		if err != nil {
			return err
		}
	}
	i, results := 0, v.Limits
	for _, r := range p.Rules {
		if why := r.WhyNot(plan.Attributes); why != "" {
			fmt.Fprintf(out, "rule %s: does not apply: %s\n", r.Name, why)
			continue
		}
		if by := r.ReplacedBy(plan.Attributes); by != "" {
			fmt.Fprintf(out, "rule %s: applies, but %s replaces it\n", r.Name, by)
			continue
		}
		note := ""
		switch {
		case r.Unlimited:
			note = " (unlimited: admits without a limit)"
		case r.Shadow:
			note = " (shadow: reported, never denies)"
		}
		fmt.Fprintf(out, "rule %s: applies%s\n", r.Name, note)
		for ; i < len(plan.Items) && plan.Items[i].Rule == r; i++ {
			key, m := plan.Items[i].Key, plan.Items[i].Meter
			fmt.Fprintf(out, "  key %s (slot %d)\n", key, algo.Slot(key))
			for _, l := range m.Limits {
				fmt.Fprintf(out, "    %s", l)
				if len(results) > 0 {
					fmt.Fprintf(out, ": %s", formatDecision(results[0].Decision))
					results = results[1:]
				}
				fmt.Fprintln(out)
			}
		}
	}
	if len(plan.Items) == 0 {
		fmt.Fprintln(out, "no rule applies: the request is allowed without a limit")
	}
	if plan.KeyRequired {
		fmt.Fprintln(out, "an API key is required: only rules keyed on api_key could limit this request (the authorizer answers 401)")
	}
	if *url == "" && len(plan.Items) > 0 {
		fmt.Fprintln(out, "(with --redis URL, each limit's current state is shown)")
	}
	return nil
}

func formatAttrs(attrs map[string]string) string {
	if len(attrs) == 0 {
		return "without attributes"
	}
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(attrs)) {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s=%q", k, attrs[k])
	}
	return b.String()
}

func formatDecision(d algo.Decision) string {
	if !d.Allowed && d.RetryAfter > 0 {
		return fmt.Sprintf("denied now, %d of %d left, admits again in %v", max(0, d.Remaining), d.Limit, d.RetryAfter.Round(time.Millisecond))
	}
	return fmt.Sprintf("%d of %d left, full again in %v", max(0, d.Remaining), d.Limit, d.ResetAfter.Round(time.Millisecond))
}

// explainTimeout bounds policy explain's read of the state in Redis.
const explainTimeout = 5 * time.Second
