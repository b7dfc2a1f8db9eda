// Package awsredis authenticates tollgate's Redis client to Amazon ElastiCache (Redis
// OSS or Valkey) in one of two ways:
//
//   - an AUTH token (or an RBAC user's password) kept in AWS Secrets Manager, fetched
//     once when the function starts (REDIS_AUTH_SECRET_ARN); or
//   - IAM authentication (REDIS_IAM_USER, REDIS_CACHE_NAME, REDIS_IAM_SERVERLESS): a
//     short-lived token, the SigV4-presigned "connect" request, signed with the
//     function's own credentials and replaced before its 15 minutes run out.
//
// Either way the result is a credentials provider for go-redis (redisstore.Config's
// CredentialsProvider), called whenever a connection is opened. Secrets and tokens are
// never logged and never appear in an error.
package awsredis

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
)

// Environment variables read by AuthFromEnv.
const (
	EnvAuthSecretARN = "REDIS_AUTH_SECRET_ARN"
	EnvIAMUser       = "REDIS_IAM_USER"
	EnvCacheName     = "REDIS_CACHE_NAME"
	EnvIAMServerless = "REDIS_IAM_SERVERLESS"
)

// DefaultTokenTimeout bounds the signing of one IAM token when a connection opens.
const DefaultTokenTimeout = 2 * time.Second

// A Mode is how the client authenticates.
type Mode string

// The modes.
const (
	// ModeNone uses whatever REDIS_URL carries (a password in the URL, or nothing).
	ModeNone Mode = "none"
	// ModeSecret uses an AUTH token from Secrets Manager.
	ModeSecret Mode = "secret"
	// ModeIAM uses ElastiCache IAM authentication.
	ModeIAM Mode = "iam"
)

// Auth says how to authenticate to ElastiCache. The zero value is ModeNone.
type Auth struct {
	// SecretARN is the ARN (or name) of the Secrets Manager secret holding the AUTH
	// token.
	SecretARN string
	// IAMUser is the IAM-enabled ElastiCache user id.
	IAMUser string
	// CacheName is the replication group id or serverless cache name (IAM only).
	CacheName string
	// Serverless marks a serverless cache (IAM only).
	Serverless bool
}

// AuthFromEnv reads REDIS_AUTH_SECRET_ARN, REDIS_IAM_USER, REDIS_CACHE_NAME and
// REDIS_IAM_SERVERLESS. The secret and IAM are exclusive; IAM needs both the user and
// the cache name.
func AuthFromEnv(getenv func(string) string) (Auth, error) {
	a := Auth{
		SecretARN: strings.TrimSpace(getenv(EnvAuthSecretARN)),
		IAMUser:   strings.TrimSpace(getenv(EnvIAMUser)),
		CacheName: strings.TrimSpace(getenv(EnvCacheName)),
	}
	if s := strings.TrimSpace(getenv(EnvIAMServerless)); s != "" {
		b, err := strconv.ParseBool(s)
		if err != nil {
			return Auth{}, fmt.Errorf("awsredis: %s=%q: want true or false", EnvIAMServerless, s)
		}
		a.Serverless = b
	}
	iam := a.IAMUser != "" || a.CacheName != ""
	switch {
	case a.SecretARN != "" && iam:
		return Auth{}, fmt.Errorf("awsredis: set either %s (AUTH token) or %s and %s (IAM), not both", EnvAuthSecretARN, EnvIAMUser, EnvCacheName)
	case iam && a.IAMUser == "":
		return Auth{}, fmt.Errorf("awsredis: %s is set but %s is empty: IAM authentication needs both", EnvCacheName, EnvIAMUser)
	case iam && a.CacheName == "":
		return Auth{}, fmt.Errorf("awsredis: %s is set but %s is empty: IAM authentication needs both", EnvIAMUser, EnvCacheName)
	case a.Serverless && !iam:
		return Auth{}, fmt.Errorf("awsredis: %s=true needs %s and %s", EnvIAMServerless, EnvIAMUser, EnvCacheName)
	}
	return a, nil
}

// Mode returns how a authenticates.
func (a Auth) Mode() Mode {
	switch {
	case a.SecretARN != "":
		return ModeSecret
	case a.IAMUser != "":
		return ModeIAM
	default:
		return ModeNone
	}
}

// Provider returns the credentials provider for a's mode, or nil for ModeNone. In
// ModeSecret it fetches the secret now, once, with a Secrets Manager client made from
// cfg; in ModeIAM it signs a first token now, so that a missing region or credentials
// fail the start and not the first request. onError (may be nil) receives the
// failures of later token refreshes.
func (a Auth) Provider(ctx context.Context, cfg aws.Config, onError func(error)) (func() (string, string), error) {
	switch a.Mode() {
	case ModeSecret:
		c, err := FetchSecret(ctx, secretsmanager.NewFromConfig(cfg), a.SecretARN)
		if err != nil {
			return nil, err
		}
		return func() (string, string) { return c.Username, c.Password }, nil
	case ModeIAM:
		p, err := NewTokenProvider(IAMConfig{
			UserID:      a.IAMUser,
			CacheName:   a.CacheName,
			Serverless:  a.Serverless,
			Region:      cfg.Region,
			Credentials: cfg.Credentials,
		})
		if err != nil {
			return nil, err
		}
		if _, err := p.Token(ctx); err != nil {
			return nil, err
		}
		return p.Provider(DefaultTokenTimeout, onError), nil
	default:
		return nil, nil
	}
}

// Credentials are a Redis username and password. An empty Username authenticates
// as the default user.
type Credentials struct {
	Username string
	Password string
}

// SecretGetter is the part of the Secrets Manager client FetchSecret uses.
type SecretGetter interface {
	GetSecretValue(ctx context.Context, in *secretsmanager.GetSecretValueInput, optFns ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error)
}

// FetchSecret reads the AUTH token from the secret secretID (an ARN or a name); see
// ParseSecret for the forms it may take.
func FetchSecret(ctx context.Context, sm SecretGetter, secretID string) (Credentials, error) {
	if sm == nil {
		return Credentials{}, errors.New("awsredis: nil Secrets Manager client")
	}
	if secretID == "" {
		return Credentials{}, fmt.Errorf("awsredis: %s is empty", EnvAuthSecretARN)
	}
	out, err := sm.GetSecretValue(ctx, &secretsmanager.GetSecretValueInput{SecretId: aws.String(secretID)})
	if err != nil {
		return Credentials{}, fmt.Errorf("awsredis: get secret %s: %w", secretID, err)
	}
	var raw string
	switch {
	case out.SecretString != nil:
		raw = *out.SecretString
	case len(out.SecretBinary) > 0:
		raw = string(out.SecretBinary)
	}
	c, err := ParseSecret(raw)
	if err != nil {
		return Credentials{}, fmt.Errorf("awsredis: secret %s: %w", secretID, err)
	}
	return c, nil
}

// passwordKeys are the members of a JSON secret that may hold the password, in the
// order they are tried.
var passwordKeys = []string{"password", "authToken", "auth_token", "token"}

// ParseSecret reads a secret's value: either the AUTH token itself (a trailing
// newline is dropped), or a JSON object with the token in "password" (the form of
// Secrets Manager's ElastiCache user rotation), "authToken", "auth_token" or "token",
// and optionally the RBAC user in "username". Errors never include the value.
func ParseSecret(raw string) (Credentials, error) {
	raw = strings.TrimRight(raw, "\r\n")
	if strings.TrimSpace(raw) == "" {
		return Credentials{}, errors.New("the secret is empty: store the AUTH token as its value")
	}
	if !strings.HasPrefix(strings.TrimSpace(raw), "{") {
		return Credentials{Password: raw}, nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(raw), &m); err != nil {
		return Credentials{}, errors.New("the secret starts with '{' but is not a JSON object; store the token itself or {\"password\": \"...\"}")
	}
	var c Credentials
	if u, ok := m["username"]; ok {
		s, ok := u.(string)
		if !ok {
			return Credentials{}, errors.New(`the secret's "username" is not a string`)
		}
		c.Username = s
	}
	for _, k := range passwordKeys {
		v, ok := m[k]
		if !ok {
			continue
		}
		s, ok := v.(string)
		if !ok || s == "" {
			return Credentials{}, fmt.Errorf("the secret's %q is not a non-empty string", k)
		}
		c.Password = s
		return c, nil
	}
	return Credentials{}, fmt.Errorf("the secret is a JSON object without a password: put the token in one of %s", strings.Join(passwordKeys, ", "))
}
