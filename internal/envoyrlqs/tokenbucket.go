package envoyrlqs

import (
	"math"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
)

// minFillRate is Envoy's floor on a token bucket's fill rate: one token a year
// (kMinFillRate in source/common/common/token_bucket_impl.cc). A rate of 0
// tokens per fill becomes this.
const minFillRate = 1.0 / (365 * 24 * 60 * 60)

// tokenBucket is Envoy's AtomicTokenBucketImpl (source/common/common/
// token_bucket_impl.h), which the filter builds for a token_bucket assignment.
// Its whole state is one time, in seconds: the bucket holds
// min(max, (now-at)*rate) tokens. Taking tokens moves at forward.
type tokenBucket struct {
	max  float64
	rate float64 // tokens a second
	at   float64 // seconds on the Envoy's monotonic clock
}

// cppMin and cppMax are std::min and std::max, which Envoy's token bucket uses:
// unlike math.Min and math.Max they return a NaN operand only in one position,
// and that decides what a bucket with an infinite fill rate does.
func cppMin(a, b float64) float64 {
	if b < a {
		return b
	}
	return a
}

func cppMax(a, b float64) float64 {
	if a < b {
		return b
	}
	return a
}

// newTokenBucket builds the bucket for tb at now (seconds) as the filter's
// createTokenBucketFromAction does (global_client_impl.cc):
//   - the fill rate is tokens_per_fill divided by fill_interval in whole
//     seconds (absl::ToInt64Seconds rounds toward zero), so an interval under
//     1 s divides by zero: the rate is infinite and the bucket admits every
//     request;
//   - a bucket that replaces an earlier one (prev non-nil) starts with the
//     same ratio of remaining to maximum tokens as prev had at now, rounded
//     down to a whole token (Envoy PR 37624, merged December 2024: before it,
//     a replacement started full); a first bucket starts full;
//   - a bucket that starts with 0 tokens starts empty and fills from now.
func newTokenBucket(tb *typev3.TokenBucket, now float64, prev *tokenBucket) *tokenBucket {
	intervalSec := tb.GetFillInterval().AsDuration().Truncate(time.Second).Seconds()
	rate := float64(tb.GetTokensPerFill().GetValue()) / intervalSec // +Inf or NaN when intervalSec is 0
	rate = cppMax(math.Abs(rate), minFillRate)
	max := float64(tb.GetMaxTokens())
	initial := max
	if prev != nil {
		initial = math.Trunc(max * (prev.remaining(now) / prev.max)) // uint64 in Envoy
	}
	b := &tokenBucket{max: max, rate: rate, at: now}
	if initial != 0 {
		b.at = now - initial/rate
	}
	return b
}

// remaining is the number of tokens (fractional) in the bucket at now.
func (b *tokenBucket) remaining(now float64) float64 {
	return cppMin(b.max, (now-b.at)*b.rate)
}

// take takes one token at now, as consume(1, false) does, and reports whether
// there was one.
func (b *tokenBucket) take(now float64) bool {
	total := b.remaining(now)
	if !(total >= 1) {
		return false
	}
	b.at = now - (total-1)/b.rate
	return true
}

// sameTokenBucket is the filter's protoTokenBucketsEq: two token_bucket
// assignments are "equal", and the running bucket is kept, when max_tokens,
// tokens_per_fill and the nanoseconds part of fill_interval agree. Envoy does
// not compare fill_interval's seconds, so a changed interval alone keeps the
// bucket (and its old rate).
func sameTokenBucket(a, b *typev3.TokenBucket) bool {
	return a.GetMaxTokens() == b.GetMaxTokens() &&
		a.GetTokensPerFill().GetValue() == b.GetTokensPerFill().GetValue() &&
		a.GetFillInterval().GetNanos() == b.GetFillInterval().GetNanos()
}
