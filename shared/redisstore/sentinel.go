package redisstore

import (
	"context"
	"errors"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Sentinel group's master is one breaker, "sentinel:NAME", whichever node it is:
// the failover client finds the master anew at each dial, so the breaker's next probe
// reaches the new master once a Sentinel names it. But while the old master was down
// the probe wait doubled (up to open_for), and nothing in the breaker knows of the
// switch. So the store subscribes to +switch-master on one Sentinel at a time, and a
// switch of its master tells the breaker to probe at once (breaker.ProbeNow). A lost
// subscription moves on to the next Sentinel; a switch missed meanwhile is caught by
// comparing the master's address when the next subscription starts. Without any
// Sentinel to listen to, the breaker's own backoff still recovers the node. (Naming
// the breaker by the master's address instead would need that address per request:
// go-redis keeps it unexported, and asking a Sentinel costs a round trip.)

const (
	// switchChannel is the Sentinel event of a master replaced: its payload is
	// "NAME OLD-IP OLD-PORT NEW-IP NEW-PORT".
	switchChannel = "+switch-master"
	// watchIdle is how long a subscription may be silent before a PING checks it;
	// a PING unanswered for as long again drops it.
	watchIdle = 10 * time.Second
	// watchRetry is the pause after a Sentinel could not be followed.
	watchRetry = 500 * time.Millisecond
)

// switchWatch follows one master name's switches on a Sentinel group. Its fields are
// set before run and then used by run's goroutine alone.
type switchWatch struct {
	master    string
	sentinels []string                         // addresses, tried in turn
	options   func(addr string) *redis.Options // a Sentinel connection's options
	onSwitch  func(addr string)                // called with the new master's address
	idle      time.Duration                    // watchIdle, shorter in tests
	last      string                           // the master's address last seen
}

// startWatch follows the switches of the store's Sentinel master until Close.
func (s *Store) startWatch(o *redis.FailoverOptions) {
	w := &switchWatch{
		master:    o.MasterName,
		sentinels: append([]string(nil), o.SentinelAddrs...),
		options: func(addr string) *redis.Options {
			return &redis.Options{
				Addr:         addr,
				Username:     o.SentinelUsername,
				Password:     o.SentinelPassword,
				TLSConfig:    o.TLSConfig,
				Dialer:       o.Dialer,
				DialTimeout:  o.DialTimeout,
				ReadTimeout:  o.ReadTimeout,
				WriteTimeout: o.WriteTimeout,
				MaxRetries:   -1,
				PoolSize:     1,
				// Sentinels answer neither CLIENT SETINFO nor maintenance notifications.
				DisableIdentity: true,
			}
		},
		onSwitch: func(string) { s.breakers.Load().Get(s.node).ProbeNow() },
		idle:     watchIdle,
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopWatch = cancel
	s.watchDone = make(chan struct{})
	go func() {
		defer close(s.watchDone)
		w.run(ctx)
	}()
}

// run follows the Sentinels in turn until ctx ends.
func (w *switchWatch) run(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		_ = w.follow(ctx, w.sentinels[i%len(w.sentinels)])
		select {
		case <-ctx.Done():
		case <-time.After(watchRetry):
		}
	}
}

// follow subscribes to the switches on the Sentinel at addr and reports them until
// the subscription fails or ctx ends.
func (w *switchWatch) follow(ctx context.Context, addr string) error {
	c := redis.NewSentinelClient(w.options(addr))
	defer c.Close()
	ps := c.Subscribe(ctx, switchChannel)
	defer ps.Close()
	// A read in progress ignores ctx; closing the subscription ends it.
	defer context.AfterFunc(ctx, func() { _ = ps.Close() })()
	if _, err := ps.ReceiveTimeout(ctx, w.idle); err != nil { // the subscription's confirmation
		return err
	}
	w.check(ctx, c)
	pinged := false
	for {
		msg, err := ps.ReceiveTimeout(ctx, w.idle)
		var ne net.Error
		switch {
		case err == nil:
		case errors.As(err, &ne) && ne.Timeout() && !pinged:
			if err := ps.Ping(ctx); err != nil {
				return err
			}
			pinged = true
			continue
		default:
			return err
		}
		pinged = false
		if m, ok := msg.(*redis.Message); ok {
			w.switched(m.Payload)
		}
	}
}

// check asks the Sentinel for the master's address, and reports a switch if it
// changed while no Sentinel was followed. A Sentinel that cannot say is not dropped
// for it: its +switch-master events may still come.
func (w *switchWatch) check(ctx context.Context, c *redis.SentinelClient) {
	hp, err := c.GetMasterAddrByName(ctx, w.master).Result()
	if err != nil || len(hp) != 2 {
		return
	}
	addr := net.JoinHostPort(hp[0], hp[1])
	if w.last != "" && addr != w.last {
		w.onSwitch(addr)
	}
	w.last = addr
}

// switched reports the switch a +switch-master payload announces, if it is of the
// watched master.
func (w *switchWatch) switched(payload string) {
	f := strings.Fields(payload)
	if len(f) != 5 || f[0] != w.master {
		return
	}
	w.last = net.JoinHostPort(f[3], f[4])
	w.onSwitch(w.last)
}
