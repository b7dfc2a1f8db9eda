package decision

import (
	"strconv"
	"sync"

	"github.com/tollgate-dev/tollgate/shared/jsonv"
)

// bufPool holds the buffers that /v1/check reads a request body into and then
// writes its answer from, as *[]byte. The zero value is ready to use.
type bufPool struct{ p sync.Pool }

// maxPooledBuf is the capacity above which a buffer is dropped rather than pooled:
// enough for any body (MaxBody) with room to spare, so that a rare large answer does
// not pin memory in the pool.
const maxPooledBuf = 64 << 10

// get returns an empty buffer; hand it back with put.
func (bp *bufPool) get() *[]byte {
	if b, ok := bp.p.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	b := make([]byte, 0, 1024)
	return &b
}

// put returns b to the pool. Its user must not touch b afterwards.
func (bp *bufPool) put(b *[]byte) {
	if cap(*b) > maxPooledBuf {
		return
	}
	bp.p.Put(b)
}

// appendCheckResponse appends the JSON encoding of cr to b, byte for byte what
// json.Marshal(cr) returns: the fields in declaration order, "rule", "reason" and
// "cached" omitted when empty, null for nil limits, and strings escaped as
// jsonv.AppendString escapes them with escapeHTML.
func appendCheckResponse(b []byte, cr *CheckResponse) []byte {
	b = append(b, `{"allowed":`...)
	b = strconv.AppendBool(b, cr.Allowed)
	b = append(b, `,"domain":`...)
	b = jsonv.AppendString(b, cr.Domain, true)
	if cr.Rule != "" {
		b = append(b, `,"rule":`...)
		b = jsonv.AppendString(b, cr.Rule, true)
	}
	if cr.Reason != "" {
		b = append(b, `,"reason":`...)
		b = jsonv.AppendString(b, cr.Reason, true)
	}
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, cr.Limit, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, cr.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, cr.ResetAfterMs, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, cr.RetryAfterMs, 10)
	b = append(b, `,"delay_ms":`...)
	b = strconv.AppendInt(b, cr.DelayMs, 10)
	b = append(b, `,"degraded":`...)
	b = strconv.AppendBool(b, cr.Degraded)
	if cr.Cached {
		b = append(b, `,"cached":true`...)
	}
	b = append(b, `,"limits":`...)
	if cr.Limits == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range cr.Limits {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendLimit(b, &cr.Limits[i])
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

// appendLimit appends the JSON encoding of l to b, as json.Marshal(l) returns it.
func appendLimit(b []byte, l *LimitJSON) []byte {
	b = append(b, `{"rule":`...)
	b = jsonv.AppendString(b, l.Rule, true)
	b = append(b, `,"algorithm":`...)
	b = jsonv.AppendString(b, l.Algorithm, true)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, l.Allowed)
	b = append(b, `,"shadow":`...)
	b = strconv.AppendBool(b, l.Shadow)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, l.Limit, 10)
	b = append(b, `,"window_ms":`...)
	b = strconv.AppendInt(b, l.WindowMs, 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, l.Remaining, 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, l.ResetAfterMs, 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, l.RetryAfterMs, 10)
	b = append(b, `,"delay_ms":`...)
	b = strconv.AppendInt(b, l.DelayMs, 10)
	return append(b, '}')
}
