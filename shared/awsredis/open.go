package awsredis

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	awsconfig "github.com/aws/aws-sdk-go-v2/config"

	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// Time limits of OpenStore.
const (
	// PreloadTimeout bounds loading the scripts. A Redis that does not answer in time
	// is not fatal: the failure mode decides until it does.
	PreloadTimeout = time.Second
	// AWSTimeout bounds the AWS calls (Secrets Manager, credentials).
	AWSTimeout = 5 * time.Second
)

// OpenStore builds the Redis store once, for a Lambda's start: authenticated as auth
// says (an AUTH token fetched from Secrets Manager now, or IAM tokens signed now and
// refreshed before they expire), with rc's timeouts, and the scripts preloaded. A
// Redis that does not answer yet is logged, not an error; a configuration, secret or
// credentials failure is.
func OpenStore(ctx context.Context, rc redisstore.Config, auth Auth, log *slog.Logger) (*redisstore.Store, error) {
	if auth.Mode() != ModeNone {
		actx, cancel := context.WithTimeout(ctx, AWSTimeout)
		defer cancel()
		awsCfg, err := awsconfig.LoadDefaultConfig(actx)
		if err != nil {
			return nil, fmt.Errorf("awsredis: load the AWS configuration: %w", err)
		}
		provider, err := auth.Provider(actx, awsCfg, func(err error) {
			log.Error("cannot sign an ElastiCache IAM token", "err", err)
		})
		if err != nil {
			return nil, fmt.Errorf("awsredis: Redis authentication: %w", err)
		}
		rc.CredentialsProvider = provider
	}
	st, err := redisstore.Open(rc)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, PreloadTimeout)
	defer cancel()
	if err := st.Preload(pctx); err != nil {
		log.Warn("cannot preload the scripts; the failure mode decides until Redis answers",
			"redis", redisstore.Redact(rc.URL), "err", err)
	} else if off, counting := st.ClockOffset(); !counting {
		log.Warn("this clock and the Redis server's differ by more than half a second; fixed_window limits are decided by the script on the server's clock (keep the clocks in sync with NTP)",
			"redis", redisstore.Redact(rc.URL), "offset", off)
	}
	return st, nil
}
