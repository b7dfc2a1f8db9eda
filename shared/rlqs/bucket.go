package rlqs

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// Bounds of a bucket id, beside the engine's bounds on attributes (package bounds):
// the id is kept for as long as Envoy reports the bucket, so its whole size is
// bounded, not only each entry's.
const (
	// MaxBucketEntries is how many entries a bucket id may have.
	MaxBucketEntries = 32
	// MaxBucketIDBytes bounds the bytes of a bucket id's keys and values together.
	MaxBucketIDBytes = 4096
)

// What a bucket and a quota hold beyond their keys' bytes, charged to
// Limits.MaxBucketBytes; measured by TestBucketBytes (the heap a full budget
// grows by stays under the budget).
const (
	// bucketOverhead is a bucket's ledger, its id's map, its entries in the
	// stream's and the share's maps, and the grant it keeps as sent.
	bucketOverhead = 1280
	// shareOverhead is a share, its plan, its demand board and its ledgers' map.
	shareOverhead = 2 << 10
)

// bucketKey returns a key that names a bucket id within a stream (its entries
// sorted, each length-prefixed, so that two ids have the same key only if they are
// equal) and a copy of the id whose keys and values are parts of the key: a bucket
// kept holds its id's bytes once. The copy's map is the attributes the id stands
// for. It reports an id past the bounds, or empty, naming the bound.
func bucketKey(id *rlqspb.BucketId) (*rlqspb.BucketId, string, error) {
	m := id.GetBucket()
	switch {
	case len(m) == 0:
		return nil, "", fmt.Errorf("bucket_id.bucket is empty: Envoy's bucket_id_builder must give every bucket at least one entry")
	case len(m) > MaxBucketEntries:
		return nil, "", fmt.Errorf("bucket_id.bucket has %d entries; at most %d", len(m), MaxBucketEntries)
	}
	size := 0
	for k, v := range m {
		size += len(k) + len(v)
		if size > MaxBucketIDBytes {
			return nil, "", fmt.Errorf("bucket_id.bucket is over %d bytes (keys and values together)", MaxBucketIDBytes)
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return nil, "", fmt.Errorf("bucket_id.bucket[%q]: not valid UTF-8", clip(k))
		}
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.Grow(size + 8*len(m))
	at := make([]int, 0, 2*len(m)) // where each key and value starts in b
	for _, k := range keys {
		v := m[k]
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		at = append(at, b.Len())
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		at = append(at, b.Len())
		b.WriteString(v)
	}
	key := b.String()
	kept := make(map[string]string, len(m))
	for i, k := range keys {
		kept[key[at[2*i]:at[2*i]+len(k)]] = key[at[2*i+1] : at[2*i+1]+len(m[k])]
	}
	return &rlqspb.BucketId{Bucket: kept}, key, nil
}

// clip cuts a name to 64 bytes for a message.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64]
}
