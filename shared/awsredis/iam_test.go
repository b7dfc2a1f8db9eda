package awsredis

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/url"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// Fixed inputs of the golden tests: the example credentials of the AWS SigV4
// documentation and a fixed signing time.
var (
	exampleCreds = aws.Credentials{
		AccessKeyID:     "AKIDEXAMPLE",
		SecretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY",
	}
	signingTime = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
)

func TestPresignGolden(t *testing.T) {
	t.Parallel()
	withSession := exampleCreds
	withSession.SessionToken = "session/token+value="
	tests := []struct {
		name       string
		creds      aws.Credentials
		cache      string
		region     string
		serverless bool
		want       string
	}{
		{
			name: "replication group", creds: exampleCreds, cache: "tollgate-cache", region: "us-east-1",
			want: "tollgate-cache/?Action=connect&User=tollgate-user" +
				"&X-Amz-Algorithm=AWS4-HMAC-SHA256" +
				"&X-Amz-Credential=AKIDEXAMPLE%2F20250102%2Fus-east-1%2Felasticache%2Faws4_request" +
				"&X-Amz-Date=20250102T030405Z&X-Amz-Expires=900&X-Amz-SignedHeaders=host" +
				"&X-Amz-Signature=166f9f6cb07e0a1768970809c5fc10e97238ec5110fbcde33c952a5dbf258b9d",
		},
		{
			name: "serverless with session token", creds: withSession, cache: "My-Cache", region: "eu-west-1", serverless: true,
			want: "my-cache/?Action=connect&ResourceType=ServerlessCache&User=tollgate-user" +
				"&X-Amz-Algorithm=AWS4-HMAC-SHA256" +
				"&X-Amz-Credential=AKIDEXAMPLE%2F20250102%2Feu-west-1%2Felasticache%2Faws4_request" +
				"&X-Amz-Date=20250102T030405Z&X-Amz-Expires=900" +
				"&X-Amz-Security-Token=session%2Ftoken%2Bvalue%3D&X-Amz-SignedHeaders=host" +
				"&X-Amz-Signature=23f9d7512454178c60ee4f500413a1c2cbe7584917591e4090833941ff0a207d",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Presign(context.Background(), tt.creds, "tollgate-user", tt.cache, tt.region, tt.serverless, signingTime)
			if err != nil {
				t.Fatalf("Presign() error = %v", err)
			}
			if got != tt.want {
				t.Errorf("Presign() =\n%s\nwant\n%s", got, tt.want)
			}
			if strings.HasPrefix(got, "http") {
				t.Errorf("Presign() = %q, want the scheme stripped", got)
			}
			// The golden value is checked against an independent SigV4 computation,
			// so that it cannot be a wrong value frozen in.
			if err := verifySigV4(got, tt.creds.SecretAccessKey, tt.region); err != nil {
				t.Errorf("verifySigV4(%q) = %v", got, err)
			}
		})
	}
}

// verifySigV4 recomputes the signature of a presigned token by the SigV4 algorithm of
// the AWS General Reference (canonical request, string to sign, derived key) and
// compares it with the token's X-Amz-Signature.
func verifySigV4(token, secret, region string) error {
	host, rawQuery, ok := strings.Cut(token, "/?")
	if !ok {
		return errors.New("no /? in token")
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return err
	}
	sig := q.Get("X-Amz-Signature")
	q.Del("X-Amz-Signature")
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var cq []string
	for _, k := range keys {
		cq = append(cq, awsEscape(k)+"="+awsEscape(q.Get(k)))
	}
	canonical := strings.Join([]string{
		"GET", "/", strings.Join(cq, "&"),
		"host:" + host + "\n", "host",
		emptyPayloadHash,
	}, "\n")
	date := q.Get("X-Amz-Date")
	scope := date[:8] + "/" + region + "/elasticache/aws4_request"
	if q.Get("X-Amz-Credential") != "AKIDEXAMPLE/"+scope {
		return errors.New("credential scope " + q.Get("X-Amz-Credential") + ", want AKIDEXAMPLE/" + scope)
	}
	if q.Get("X-Amz-Expires") != "900" || q.Get("Action") != "connect" {
		return errors.New("want X-Amz-Expires=900 and Action=connect")
	}
	sum := sha256.Sum256([]byte(canonical))
	toSign := "AWS4-HMAC-SHA256\n" + date + "\n" + scope + "\n" + hex.EncodeToString(sum[:])
	key := []byte("AWS4" + secret)
	for _, part := range []string{date[:8], region, "elasticache", "aws4_request"} {
		key = hmacSHA256(key, part)
	}
	if want := hex.EncodeToString(hmacSHA256(key, toSign)); sig != want {
		return errors.New("signature " + sig + ", recomputed " + want)
	}
	return nil
}

func hmacSHA256(key []byte, data string) []byte {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(data))
	return m.Sum(nil)
}

// awsEscape is SigV4's URI encoding: every byte but A-Z a-z 0-9 - _ . ~ escaped.
func awsEscape(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("-_.~", c) >= 0 {
			b.WriteByte(c)
			continue
		}
		b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{c})))
	}
	return b.String()
}

func TestPresignRejectsMissingInputs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tests := []struct {
		name                string
		creds               aws.Credentials
		user, cache, region string
		want                string
	}{
		{"user", exampleCreds, "", "c", "us-east-1", "user id"},
		{"cache", exampleCreds, "u", "", "us-east-1", "cache name"},
		{"region", exampleCreds, "u", "c", "", "region"},
		{"credentials", aws.Credentials{}, "u", "c", "us-east-1", "credentials"},
	}
	for _, tt := range tests {
		_, err := Presign(ctx, tt.creds, tt.user, tt.cache, tt.region, false, signingTime)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Presign(missing %s) error = %v, want one naming %q", tt.name, err, tt.want)
		}
	}
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// countingCreds is a credentials provider that counts its calls.
type countingCreds struct {
	mu    sync.Mutex
	calls int
	creds aws.Credentials
	err   error
}

func (c *countingCreds) Retrieve(context.Context) (aws.Credentials, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls++
	return c.creds, c.err
}

func TestTokenProviderRefreshesBeforeExpiry(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: signingTime}
	creds := &countingCreds{creds: exampleCreds}
	p, err := NewTokenProvider(IAMConfig{
		UserID: "tollgate-user", CacheName: "tollgate-cache", Region: "us-east-1",
		Credentials: creds, Clock: clock.Now,
	})
	if err != nil {
		t.Fatalf("NewTokenProvider() error = %v", err)
	}
	ctx := context.Background()
	first, err := p.Token(ctx)
	if err != nil {
		t.Fatalf("Token() error = %v", err)
	}
	// Reused while it has more than the 5-minute margin left: up to 10 minutes.
	for _, step := range []time.Duration{time.Minute, 4 * time.Minute, 9*time.Minute + 59*time.Second} {
		clock.Set(signingTime.Add(step))
		got, err := p.Token(ctx)
		if err != nil {
			t.Fatalf("Token() at +%v error = %v", step, err)
		}
		if got != first {
			t.Fatalf("Token() at +%v signed a new token, want the cached one", step)
		}
	}
	if p.Signed() != 1 {
		t.Fatalf("Signed() = %d after reuse, want 1", p.Signed())
	}
	// At 10 minutes (5 before expiry) a new token is signed, with the new time.
	clock.Set(signingTime.Add(10 * time.Minute))
	second, err := p.Token(ctx)
	if err != nil {
		t.Fatalf("Token() error = %v", err)
	}
	if second == first {
		t.Fatalf("Token() at +10m = the first token, want a fresh one")
	}
	if !strings.Contains(second, "X-Amz-Date=20250102T031405Z") {
		t.Errorf("Token() at +10m = %q, want X-Amz-Date=20250102T031405Z", second)
	}
	if err := verifySigV4(second, exampleCreds.SecretAccessKey, "us-east-1"); err != nil {
		t.Errorf("verifySigV4(refreshed) = %v", err)
	}
	if p.Signed() != 2 || creds.calls != 2 {
		t.Errorf("Signed() = %d, credential calls = %d, want 2 and 2", p.Signed(), creds.calls)
	}
	// Never older than the lifetime minus the margin: a token used at any moment
	// has at least 5 minutes left.
	for range 40 {
		clock.Advance(47 * time.Second)
		tok, err := p.Token(ctx)
		if err != nil {
			t.Fatalf("Token() error = %v", err)
		}
		signed := tokenTime(t, tok)
		if left := signed.Add(TokenLifetime).Sub(clock.Now()); left < DefaultRefreshMargin {
			t.Fatalf("Token() at %v has %v left, want at least %v", clock.Now(), left, DefaultRefreshMargin)
		}
	}
}

func tokenTime(t *testing.T, tok string) time.Time {
	t.Helper()
	_, rawQuery, _ := strings.Cut(tok, "/?")
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		t.Fatalf("ParseQuery(%q) error = %v", rawQuery, err)
	}
	ts, err := time.Parse("20060102T150405Z", q.Get("X-Amz-Date"))
	if err != nil {
		t.Fatalf("X-Amz-Date %q: %v", q.Get("X-Amz-Date"), err)
	}
	return ts
}

func TestTokenProviderFollowsExpiringCredentials(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{now: signingTime}
	c := exampleCreds
	c.CanExpire = true
	c.Expires = signingTime.Add(7 * time.Minute) // sooner than the token's 15
	creds := &countingCreds{creds: c}
	p, err := NewTokenProvider(IAMConfig{
		UserID: "u", CacheName: "c", Region: "us-east-1", Credentials: creds, Clock: clock.Now,
	})
	if err != nil {
		t.Fatalf("NewTokenProvider() error = %v", err)
	}
	ctx := context.Background()
	if _, err := p.Token(ctx); err != nil {
		t.Fatalf("Token() error = %v", err)
	}
	clock.Advance(time.Minute)
	if _, err := p.Token(ctx); err != nil || p.Signed() != 1 {
		t.Fatalf("Token() at +1m: signed %d, err %v; want the cached token", p.Signed(), err)
	}
	clock.Advance(time.Minute) // +2m: 5 minutes before the credentials expire
	if _, err := p.Token(ctx); err != nil || p.Signed() != 2 {
		t.Fatalf("Token() at +2m: signed %d, err %v; want a new token", p.Signed(), err)
	}
}

func TestTokenProviderReportsCredentialErrors(t *testing.T) {
	t.Parallel()
	creds := &countingCreds{err: errors.New("no credentials in the environment")}
	p, err := NewTokenProvider(IAMConfig{UserID: "u", CacheName: "c", Region: "us-east-1", Credentials: creds})
	if err != nil {
		t.Fatalf("NewTokenProvider() error = %v", err)
	}
	if _, err := p.Token(context.Background()); err == nil || !strings.Contains(err.Error(), "no credentials") {
		t.Errorf("Token() error = %v, want the credentials error", err)
	}
	var got error
	user, pass := p.Provider(time.Second, func(err error) { got = err })()
	if user != "u" || pass != "" || got == nil {
		t.Errorf("Provider()() = %q, %q, onError(%v); want u, empty password, an error", user, pass, got)
	}
}

func TestNewTokenProviderValidates(t *testing.T) {
	t.Parallel()
	ok := IAMConfig{UserID: "u", CacheName: "c", Region: "r", Credentials: &countingCreds{}}
	tests := []struct {
		name string
		edit func(*IAMConfig)
		want string
	}{
		{"user", func(c *IAMConfig) { c.UserID = "" }, "REDIS_IAM_USER"},
		{"cache", func(c *IAMConfig) { c.CacheName = "" }, "REDIS_CACHE_NAME"},
		{"region", func(c *IAMConfig) { c.Region = "" }, "AWS_REGION"},
		{"credentials", func(c *IAMConfig) { c.Credentials = nil }, "credentials"},
		{"margin", func(c *IAMConfig) { c.RefreshMargin = TokenLifetime }, "RefreshMargin"},
	}
	for _, tt := range tests {
		c := ok
		tt.edit(&c)
		if _, err := NewTokenProvider(c); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("NewTokenProvider(bad %s) error = %v, want one naming %q", tt.name, err, tt.want)
		}
	}
}
