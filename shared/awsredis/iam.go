package awsredis

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
)

// IAM token constants, from the ElastiCache user guide ("Authenticating with IAM").
const (
	// TokenLifetime is how long ElastiCache accepts an IAM auth token after it is
	// signed.
	TokenLifetime = 15 * time.Minute
	// DefaultRefreshMargin is how long before its expiry a cached token is replaced.
	DefaultRefreshMargin = 5 * time.Minute
	// signingService is the SigV4 service name of the connect request.
	signingService = "elasticache"
	// emptyPayloadHash is the SHA-256 of an empty body: the connect request has none.
	emptyPayloadHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
)

// Presign returns an ElastiCache IAM authentication token: the SigV4-presigned URL
// of the request
//
//	GET http://<cacheName>/?Action=connect&User=<userID>[&ResourceType=ServerlessCache]
//
// signed for service "elasticache" in region at signingTime, valid 900 seconds, with
// the "http://" scheme removed. It is the password of an AUTH (or HELLO) as userID;
// ElastiCache requires an IAM-enabled user's name to equal its user id.
//
// cacheName is the replication group id, or the serverless cache name when
// serverless is true; ElastiCache wants it in lower case. The token carries the
// credentials' session token, so it is valid only while they are.
func Presign(ctx context.Context, creds aws.Credentials, userID, cacheName, region string, serverless bool, signingTime time.Time) (string, error) {
	switch {
	case userID == "":
		return "", errors.New("awsredis: IAM token: empty user id (REDIS_IAM_USER)")
	case cacheName == "":
		return "", errors.New("awsredis: IAM token: empty cache name (REDIS_CACHE_NAME)")
	case region == "":
		return "", errors.New("awsredis: IAM token: empty region (AWS_REGION)")
	case !creds.HasKeys():
		return "", errors.New("awsredis: IAM token: no AWS credentials")
	}
	q := url.Values{}
	q.Set("Action", "connect")
	q.Set("User", userID)
	if serverless {
		q.Set("ResourceType", "ServerlessCache")
	}
	q.Set("X-Amz-Expires", strconv.Itoa(int(TokenLifetime/time.Second)))
	u := url.URL{Scheme: "http", Host: strings.ToLower(cacheName), Path: "/", RawQuery: q.Encode()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return "", fmt.Errorf("awsredis: IAM token: build the connect request for cache %q: %w", cacheName, err)
	}
	signed, _, err := v4.NewSigner().PresignHTTP(ctx, creds, req, emptyPayloadHash, signingService, region, signingTime)
	if err != nil {
		return "", fmt.Errorf("awsredis: IAM token: presign: %w", err)
	}
	return strings.TrimPrefix(signed, "http://"), nil
}

// IAMConfig configures a TokenProvider.
type IAMConfig struct {
	// UserID is the IAM-enabled ElastiCache user (its id, which equals its name).
	UserID string
	// CacheName is the replication group id or the serverless cache name.
	CacheName string
	// Serverless marks a serverless cache (REDIS_IAM_SERVERLESS=true).
	Serverless bool
	// Region is the cache's AWS region.
	Region string
	// Credentials sign the tokens; wrap them in an aws.CredentialsCache.
	Credentials aws.CredentialsProvider
	// Clock reads the time (default time.Now).
	Clock func() time.Time
	// RefreshMargin is how long before a token's expiry it is replaced (default 5
	// minutes, so a token is at most 10 minutes old when it is used).
	RefreshMargin time.Duration
}

// A TokenProvider hands out ElastiCache IAM tokens, signing a new one when the
// cached token is within RefreshMargin of its expiry: 15 minutes after signing, or
// earlier when the signing credentials expire first.
//
// go-redis asks for credentials only when it opens a connection; an open connection
// stays authenticated after its token expires, until ElastiCache closes it at 12
// hours, so connections must be recycled well before that (redisstore's
// ConnMaxLifetime). A TokenProvider is safe for simultaneous use.
type TokenProvider struct {
	cfg IAMConfig

	mu      sync.Mutex
	token   string
	expires time.Time
	signed  int // tokens signed, for tests and logs
}

// NewTokenProvider checks cfg and returns a provider. It signs nothing yet.
func NewTokenProvider(cfg IAMConfig) (*TokenProvider, error) {
	switch {
	case cfg.UserID == "":
		return nil, errors.New("awsredis: REDIS_IAM_USER is empty: set it to the IAM-enabled ElastiCache user id")
	case cfg.CacheName == "":
		return nil, errors.New("awsredis: REDIS_CACHE_NAME is empty: set it to the replication group id or serverless cache name")
	case cfg.Region == "":
		return nil, errors.New("awsredis: no AWS region: set AWS_REGION")
	case cfg.Credentials == nil:
		return nil, errors.New("awsredis: nil credentials provider")
	case cfg.RefreshMargin < 0 || cfg.RefreshMargin >= TokenLifetime:
		return nil, fmt.Errorf("awsredis: RefreshMargin %v: want 0 (default) to less than %v", cfg.RefreshMargin, TokenLifetime)
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.RefreshMargin == 0 {
		cfg.RefreshMargin = DefaultRefreshMargin
	}
	return &TokenProvider{cfg: cfg}, nil
}

// Token returns a token valid for at least RefreshMargin, signing a new one when
// the cached one is older.
func (p *TokenProvider) Token(ctx context.Context) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.cfg.Clock()
	if p.token != "" && now.Before(p.expires.Add(-p.cfg.RefreshMargin)) {
		return p.token, nil
	}
	creds, err := p.cfg.Credentials.Retrieve(ctx)
	if err != nil {
		return "", fmt.Errorf("awsredis: IAM token: retrieve AWS credentials: %w", err)
	}
	tok, err := Presign(ctx, creds, p.cfg.UserID, p.cfg.CacheName, p.cfg.Region, p.cfg.Serverless, now)
	if err != nil {
		return "", err
	}
	expires := now.Add(TokenLifetime)
	if creds.CanExpire && creds.Expires.Before(expires) {
		expires = creds.Expires
	}
	p.token, p.expires = tok, expires
	p.signed++
	return tok, nil
}

// Credentials returns the username (the user id) and a token, the form of go-redis's
// CredentialsProviderContext.
func (p *TokenProvider) Credentials(ctx context.Context) (username, password string, err error) {
	tok, err := p.Token(ctx)
	if err != nil {
		return "", "", err
	}
	return p.cfg.UserID, tok, nil
}

// Provider returns the form of go-redis's (and redisstore.Config's)
// CredentialsProvider: each call returns the user id and a token, getting the token
// within timeout. A failure is passed to onError (when set) and yields an empty
// password, so that the connection's AUTH fails and the store reports the error.
func (p *TokenProvider) Provider(timeout time.Duration, onError func(error)) func() (string, string) {
	return func() (string, string) {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		user, tok, err := p.Credentials(ctx)
		if err != nil {
			if onError != nil {
				onError(err)
			}
			return p.cfg.UserID, ""
		}
		return user, tok
	}
}

// Signed returns how many tokens the provider has signed.
func (p *TokenProvider) Signed() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.signed
}
