// Package reload keeps a running engine's policy current: it reads the policy from its
// source (a file, an SSM Parameter Store parameter, an inline document), validates it,
// and hands a new valid policy to the engine. An invalid or unreadable one is refused
// with its problems logged and counted, and the running policy keeps serving.
package reload

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// A Source is where the policy document is read from.
type Source interface {
	// Name says where, for logs and errors: a file path, "ssm:NAME", "inline".
	Name() string
	// Read returns the document.
	Read(ctx context.Context) ([]byte, error)
}

// File is a policy file, YAML or JSON.
type File string

// Name returns the path.
func (f File) Name() string { return string(f) }

// Read reads the file, at most policy.MaxSize+1 bytes of it (Parse refuses more).
func (f File) Read(context.Context) ([]byte, error) {
	fh, err := os.Open(string(f))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	return io.ReadAll(io.LimitReader(fh, policy.MaxSize+1))
}

// Inline is a policy given whole, e.g. in an environment variable. It never changes.
type Inline struct {
	// Label names it in errors, e.g. "TOLLGATE_POLICY_JSON".
	Label string
	Doc   []byte
}

// Name returns the label.
func (i Inline) Name() string { return i.Label }

// Read returns the document.
func (i Inline) Read(context.Context) ([]byte, error) { return i.Doc, nil }

// SSMGetter is the part of the SSM client a Parameter uses.
type SSMGetter interface {
	GetParameter(ctx context.Context, in *ssm.GetParameterInput, optFns ...func(*ssm.Options)) (*ssm.GetParameterOutput, error)
}

// Parameter is an SSM Parameter Store parameter holding the policy (String, or
// SecureString, which is decrypted). A Standard parameter holds 4 KB, an Advanced one
// 8 KB.
type Parameter struct {
	Client SSMGetter
	// ParamName is the parameter's name or ARN.
	ParamName string
	// Timeout bounds one read (default DefaultParameterTimeout): a Lambda reads
	// before a request, which must not wait on SSM for long.
	Timeout time.Duration
}

// DefaultParameterTimeout is Parameter.Timeout's default.
const DefaultParameterTimeout = 2 * time.Second

// Name returns "ssm:" and the parameter's name.
func (p Parameter) Name() string { return "ssm:" + p.ParamName }

// Read returns the parameter's value.
func (p Parameter) Read(ctx context.Context) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, cmp.Or(p.Timeout, DefaultParameterTimeout))
	defer cancel()
	out, err := p.Client.GetParameter(ctx, &ssm.GetParameterInput{Name: aws.String(p.ParamName), WithDecryption: aws.Bool(true)})
	if err != nil {
		return nil, err
	}
	if out.Parameter == nil || out.Parameter.Value == nil {
		return nil, errors.New("the parameter has no value")
	}
	return []byte(*out.Parameter.Value), nil
}

// The results of a reload, the values of tollgate_policy_reloads_total's result label.
const (
	Applied   = "applied"   // a new valid policy replaced the running one
	Unchanged = "unchanged" // the document is the running one, byte for byte
	Invalid   = "invalid"   // the document is not a valid policy; the running one stays
	Failed    = "error"     // the source could not be read; the running one stays
)

// Config configures a Reloader.
type Config = ConfigOf[*policy.Policy]

// A Reloader reads the policy from its source and applies it when it changed.
type Reloader = Of[*policy.Policy]

// ConfigOf configures an Of[T]: a reloader of a configuration of type T, such as a
// policy, or the set of envoyproxy/ratelimit domains of a directory.
type ConfigOf[T any] struct {
	Source Source
	// Parse reads a document into a configuration (for a Reloader, default
	// policy.Parse); it is required otherwise.
	Parse func(doc []byte) (T, error)
	// Apply makes p the running configuration (engine.SetPolicy).
	Apply func(p T) error
	// Logger receives a line per reload that is not Unchanged (default slog.Default()).
	Logger *slog.Logger
	// Reloaded, if set, is called with the result of every reload after the first
	// load (for tollgate_policy_reloads_total).
	Reloaded func(result string)
	// Running, if set, is called with the SHA-256 (hex) of the document of each policy
	// that starts running, the first included (for tollgate_policy_info).
	Running func(sha256 string)
}

// An Of[T] reads a configuration from its source and applies it when it changed. It
// is safe for simultaneous use; reloads run one at a time.
type Of[T any] struct {
	cfg     ConfigOf[T]
	mu      sync.Mutex
	sum     string    // SHA-256 of the running document
	refused string    // SHA-256 of the document last refused as invalid
	checked time.Time // when the source was last read
}

// Load reads, validates and returns the first policy; its problems are the caller's
// to report (a service does not start on an invalid policy). It does not call Apply.
func Load(ctx context.Context, cfg Config) (*Reloader, *policy.Policy, error) {
	if cfg.Parse == nil {
		cfg.Parse = policy.Parse
	}
	return LoadOf(ctx, cfg)
}

// LoadOf is Load for a configuration of any type; cfg.Parse is required.
func LoadOf[T any](ctx context.Context, cfg ConfigOf[T]) (*Of[T], T, error) {
	var zero T
	if cfg.Parse == nil || cfg.Apply == nil {
		return nil, zero, errors.New("reload: Parse and Apply are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Of[T]{cfg: cfg}
	doc, p, err := r.read(ctx)
	if err != nil {
		return nil, zero, err
	}
	r.sum, r.checked = digest(doc), time.Now()
	if cfg.Running != nil {
		cfg.Running(r.sum)
	}
	return r, p, nil
}

// SHA256 returns the SHA-256 (hex) of the running policy's document.
func (r *Of[T]) SHA256() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sum
}

// Reload reads the source now and applies its policy if the document changed and is
// valid. It returns the result (Applied, Unchanged, Invalid or Failed) and, unless
// Applied or Unchanged, why.
func (r *Of[T]) Reload(ctx context.Context) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	result, err := r.reload(ctx)
	if r.cfg.Reloaded != nil {
		r.cfg.Reloaded(result)
	}
	switch result {
	case Applied:
		r.cfg.Logger.Info("policy reloaded", "source", r.cfg.Source.Name(), "sha256", r.sum)
	case Invalid, Failed:
		r.cfg.Logger.Error("policy reload refused; the running policy stays", "source", r.cfg.Source.Name(), "result", result, "err", err)
	}
	return result, err
}

func (r *Of[T]) reload(ctx context.Context) (string, error) {
	r.checked = time.Now()
	doc, err := r.cfg.Source.Read(ctx)
	if err != nil {
		return Failed, fmt.Errorf("reading %s: %w", r.cfg.Source.Name(), err)
	}
	sum := digest(doc)
	if sum == r.sum || sum == r.refused {
		// An invalid document is refused (logged and counted) once, not at every poll
		// until it is fixed.
		return Unchanged, nil
	}
	p, err := r.parse(doc)
	if err == nil {
		err = r.cfg.Apply(p)
	}
	if err != nil {
		r.refused = sum
		return Invalid, err
	}
	r.sum, r.refused = sum, ""
	if r.cfg.Running != nil {
		r.cfg.Running(sum)
	}
	return Applied, nil
}

// Refresh reloads when the source was last read at least ttl ago, for a process
// that cannot poll in the background (a Lambda function is frozen between
// invocations). It returns what Reload returns, or Unchanged without reading.
func (r *Of[T]) Refresh(ctx context.Context, ttl time.Duration) (string, error) {
	r.mu.Lock()
	fresh := time.Since(r.checked) < ttl
	r.mu.Unlock()
	if fresh {
		return Unchanged, nil
	}
	return r.Reload(ctx)
}

// Watch reloads every interval (never, for 0) until ctx is done, and at once whenever
// a signal arrives on now (SIGHUP).
func (r *Of[T]) Watch(ctx context.Context, every time.Duration, now <-chan os.Signal) {
	var tick <-chan time.Time
	if every > 0 {
		t := time.NewTicker(every)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		case <-now:
		}
		r.Reload(ctx)
	}
}

func (r *Of[T]) read(ctx context.Context) ([]byte, T, error) {
	doc, err := r.cfg.Source.Read(ctx)
	if err != nil {
		var zero T
		return nil, zero, fmt.Errorf("policy: reading %s: %w", r.cfg.Source.Name(), err)
	}
	p, err := r.parse(doc)
	return doc, p, err
}

// parse parses doc, naming its source in a validation error.
func (r *Of[T]) parse(doc []byte) (T, error) {
	p, err := r.cfg.Parse(doc)
	if ve, ok := errors.AsType[*policy.ValidationError](err); ok {
		ve.File = r.cfg.Source.Name()
	}
	return p, err
}

func digest(doc []byte) string {
	sum := sha256.Sum256(doc)
	return hex.EncodeToString(sum[:])
}

// Where is where a front door's configuration says the policy is; at most one of
// JSON and SSM is set, and Path is the default.
type Where struct {
	// Path is a policy file (TOLLGATE_POLICY).
	Path string
	// JSON is an inline policy (TOLLGATE_POLICY_JSON).
	JSON string
	// SSM names an SSM Parameter Store parameter (TOLLGATE_POLICY_SSM).
	SSM string
}

// Source returns the source w names. A parameter is read with the AWS SDK's default
// configuration (the Lambda role's credentials and region).
func (w Where) Source(ctx context.Context) (Source, error) {
	switch {
	case w.JSON != "" && w.SSM != "":
		return nil, errors.New("TOLLGATE_POLICY_JSON and TOLLGATE_POLICY_SSM are both set; set one")
	case w.JSON != "":
		return Inline{Label: "TOLLGATE_POLICY_JSON", Doc: []byte(w.JSON)}, nil
	case w.SSM != "":
		cfg, err := awsconfig.LoadDefaultConfig(ctx)
		if err != nil {
			return nil, fmt.Errorf("TOLLGATE_POLICY_SSM=%s: AWS configuration: %w", w.SSM, err)
		}
		return Parameter{Client: ssm.NewFromConfig(cfg), ParamName: w.SSM}, nil
	}
	return File(w.Path), nil
}
