package awsredis

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

func TestParseSecret(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		raw     string
		want    Credentials
		wantErr string
	}{
		{"plain token", "s3cret-token-value", Credentials{Password: "s3cret-token-value"}, ""},
		{"trailing newline", "s3cret\n", Credentials{Password: "s3cret"}, ""},
		{"inner spaces kept", "a b c", Credentials{Password: "a b c"}, ""},
		{"rotation form", `{"username":"app","password":"pw","user_arn":"arn:aws:elasticache:..."}`, Credentials{Username: "app", Password: "pw"}, ""},
		{"authToken", `{"authToken":"tok"}`, Credentials{Password: "tok"}, ""},
		{"token", ` {"token":"tok"}`, Credentials{Password: "tok"}, ""},
		{"empty", "", Credentials{}, "empty"},
		{"blank", " \n", Credentials{}, "empty"},
		{"broken JSON", `{"password":`, Credentials{}, "not a JSON object"},
		{"no password", `{"username":"app"}`, Credentials{}, "without a password"},
		{"password not a string", `{"password":42}`, Credentials{}, `"password" is not a non-empty string`},
		{"username not a string", `{"username":1,"password":"x"}`, Credentials{}, `"username" is not a string`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseSecret(tt.raw)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSecret(%q) error = %v, want one containing %q", tt.raw, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSecret(%q) = %+v, %v; want %+v", tt.raw, got, err, tt.want)
			}
		})
	}
}

func TestParseSecretNeverEchoesTheValue(t *testing.T) {
	t.Parallel()
	for _, raw := range []string{`{"password":`, `{"username":"hunter2"}`, `{"password":["hunter2"]}`} {
		_, err := ParseSecret(raw)
		if err == nil {
			t.Fatalf("ParseSecret(%q) error = nil, want an error", raw)
		}
		if strings.Contains(err.Error(), "hunter2") {
			t.Errorf("ParseSecret(%q) error = %q, which leaks the value", raw, err)
		}
	}
}

type fakeSecrets struct {
	out *secretsmanager.GetSecretValueOutput
	err error
	id  string
}

func (f *fakeSecrets) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	f.id = aws.ToString(in.SecretId)
	return f.out, f.err
}

func TestFetchSecret(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := &fakeSecrets{out: &secretsmanager.GetSecretValueOutput{SecretString: aws.String("tok")}}
	got, err := FetchSecret(ctx, f, "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-auth")
	if err != nil || got.Password != "tok" || f.id != "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-auth" {
		t.Fatalf("FetchSecret() = %+v, %v (asked for %q); want password tok", got, err, f.id)
	}
	f = &fakeSecrets{out: &secretsmanager.GetSecretValueOutput{SecretBinary: []byte(`{"password":"bin"}`)}}
	if got, err := FetchSecret(ctx, f, "x"); err != nil || got.Password != "bin" {
		t.Fatalf("FetchSecret(binary) = %+v, %v; want password bin", got, err)
	}
	f = &fakeSecrets{err: errors.New("AccessDeniedException")}
	if _, err := FetchSecret(ctx, f, "x"); err == nil || !strings.Contains(err.Error(), "AccessDenied") {
		t.Fatalf("FetchSecret(denied) error = %v, want AccessDenied", err)
	}
	if _, err := FetchSecret(ctx, f, ""); err == nil || !strings.Contains(err.Error(), EnvAuthSecretARN) {
		t.Fatalf("FetchSecret(\"\") error = %v, want one naming %s", err, EnvAuthSecretARN)
	}
}

func TestAuthFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		want    Auth
		mode    Mode
		wantErr string
	}{
		{"none", nil, Auth{}, ModeNone, ""},
		{"secret", map[string]string{EnvAuthSecretARN: "arn:x"}, Auth{SecretARN: "arn:x"}, ModeSecret, ""},
		{"iam", map[string]string{EnvIAMUser: "u", EnvCacheName: "c"}, Auth{IAMUser: "u", CacheName: "c"}, ModeIAM, ""},
		{"iam serverless", map[string]string{EnvIAMUser: "u", EnvCacheName: "c", EnvIAMServerless: "true"}, Auth{IAMUser: "u", CacheName: "c", Serverless: true}, ModeIAM, ""},
		{"both", map[string]string{EnvAuthSecretARN: "a", EnvIAMUser: "u", EnvCacheName: "c"}, Auth{}, "", "not both"},
		{"user only", map[string]string{EnvIAMUser: "u"}, Auth{}, "", EnvCacheName},
		{"cache only", map[string]string{EnvCacheName: "c"}, Auth{}, "", EnvIAMUser},
		{"bad bool", map[string]string{EnvIAMUser: "u", EnvCacheName: "c", EnvIAMServerless: "yes please"}, Auth{}, "", "want true or false"},
		{"serverless alone", map[string]string{EnvIAMServerless: "true"}, Auth{}, "", "needs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := AuthFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("AuthFromEnv() error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want || got.Mode() != tt.mode {
				t.Fatalf("AuthFromEnv() = %+v (mode %s), %v; want %+v (mode %s)", got, got.Mode(), err, tt.want, tt.mode)
			}
		})
	}
}

// secretsManagerServer answers GetSecretValue as Secrets Manager's JSON 1.1 protocol
// does, and counts the calls.
func secretsManagerServer(t *testing.T, value string) (*httptest.Server, *atomic.Int32) {
	t.Helper()
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if got := r.Header.Get("X-Amz-Target"); got != "secretsmanager.GetSecretValue" {
			http.Error(w, `{"__type":"UnknownOperationException"}`, http.StatusBadRequest)
			return
		}
		if !strings.HasPrefix(r.Header.Get("Authorization"), "AWS4-HMAC-SHA256 ") {
			http.Error(w, `{"__type":"MissingAuthenticationTokenException"}`, http.StatusForbidden)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var in struct{ SecretId string }
		_ = json.Unmarshal(body, &in)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		_ = json.NewEncoder(w).Encode(map[string]any{"ARN": in.SecretId, "Name": "redis-auth", "SecretString": value, "VersionId": "v1"})
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func testAWSConfig(endpoint string) aws.Config {
	return aws.Config{
		Region:       "us-east-1",
		Credentials:  credentials.NewStaticCredentialsProvider(exampleCreds.AccessKeyID, exampleCreds.SecretAccessKey, ""),
		BaseEndpoint: aws.String(endpoint),
	}
}

// TestSecretAuthOnRealRedis fetches the AUTH token through the real SDK from a fake
// Secrets Manager endpoint, once, and authenticates a store to a redis-server that
// requires it.
func TestSecretAuthOnRealRedis(t *testing.T) {
	t.Parallel()
	const token = "an-auth-token-of-32-characters!!"
	srv := redistest.StartServer(t, redistest.WithArgs("--requirepass", token))
	sm, calls := secretsManagerServer(t, token)
	a := Auth{SecretARN: "arn:aws:secretsmanager:us-east-1:123456789012:secret:redis-auth"}
	ctx := context.Background()
	provider, err := a.Provider(ctx, testAWSConfig(sm.URL), nil)
	if err != nil {
		t.Fatalf("Provider() error = %v", err)
	}
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + srv.Addr, CredentialsProvider: provider, PoolSize: 2})
	if err != nil {
		t.Fatalf("redisstore.Open() error = %v", err)
	}
	defer st.Close()
	for range 3 {
		if err := st.Preload(ctx); err != nil {
			t.Fatalf("Preload() error = %v", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Secrets Manager calls = %d, want 1 (fetched once)", n)
	}
	// Without the provider the server refuses.
	bare, _ := redisstore.Open(redisstore.Config{URL: "redis://" + srv.Addr})
	defer bare.Close()
	if err := bare.Preload(ctx); err == nil || !strings.Contains(strings.ToLower(err.Error()), "auth") {
		t.Errorf("Preload() without AUTH error = %v, want an authentication error", err)
	}
}

// TestIAMAuthOnRealRedis authenticates with an IAM token as an ACL user's password.
// A real ElastiCache checks the token's signature; redis-server cannot, so the test
// fixes the clock, which makes the token deterministic, and gives the ACL user that
// token as its password. It shows the username and token reach AUTH as ElastiCache
// expects them, and that a refreshed token is used for new connections.
func TestIAMAuthOnRealRedis(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := &fakeClock{now: signingTime}
	p, err := NewTokenProvider(IAMConfig{
		UserID: "tollgate-user", CacheName: "tollgate-cache", Region: "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider(exampleCreds.AccessKeyID, exampleCreds.SecretAccessKey, ""),
		Clock:       clock.Now,
	})
	if err != nil {
		t.Fatalf("NewTokenProvider() error = %v", err)
	}
	first, _ := Presign(ctx, exampleCreds, "tollgate-user", "tollgate-cache", "us-east-1", false, signingTime)
	later := signingTime.Add(11 * time.Minute)
	second, _ := Presign(ctx, exampleCreds, "tollgate-user", "tollgate-cache", "us-east-1", false, later)

	srv := redistest.StartServer(t)
	srv.Do(t, "ACL", "SETUSER", "tollgate-user", "on", ">"+first, "~*", "+@all")
	srv.Do(t, "ACL", "SETUSER", "default", "off")

	var errs atomic.Int32
	st, err := redisstore.Open(redisstore.Config{
		URL:                 "redis://" + srv.Addr,
		CredentialsProvider: p.Provider(time.Second, func(error) { errs.Add(1) }),
		PoolSize:            1,
	})
	if err != nil {
		t.Fatalf("redisstore.Open() error = %v", err)
	}
	defer st.Close()
	if err := st.Preload(ctx); err != nil {
		t.Fatalf("Preload() with the IAM token error = %v", err)
	}
	who, err := st.Client().Do(ctx, "ACL", "WHOAMI").Text()
	if err != nil || who != "tollgate-user" {
		t.Fatalf("ACL WHOAMI = %q, %v; want tollgate-user", who, err)
	}

	// Eleven minutes on, a new connection gets a new token: the server must now
	// know the second one (it would refuse the first).
	clock.Set(later)
	if err := st.Client().Do(ctx, "ACL", "SETUSER", "tollgate-user", "resetpass", ">"+second).Err(); err != nil {
		t.Fatalf("ACL SETUSER error = %v", err)
	}
	fresh, err := redisstore.Open(redisstore.Config{
		URL:                 "redis://" + srv.Addr,
		CredentialsProvider: p.Provider(time.Second, nil),
		PoolSize:            1,
	})
	if err != nil {
		t.Fatalf("redisstore.Open() error = %v", err)
	}
	defer fresh.Close()
	if err := fresh.Preload(ctx); err != nil {
		t.Fatalf("Preload() with the refreshed token error = %v", err)
	}
	if p.Signed() != 2 || errs.Load() != 0 {
		t.Errorf("Signed() = %d, errors = %d; want 2 and 0", p.Signed(), errs.Load())
	}
}
