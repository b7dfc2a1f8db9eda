package redisstore

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// Every call of tollgate's Lua goes through exec: a decision, a batch of them, a
// refund. The Lua is one Redis Functions library (algo.Lua), loaded once per node
// with FUNCTION LOAD and called with FCALL, so a call runs the decision alone and not
// the definitions of every algorithm. A server without Redis Functions (Redis before
// 7, miniredis) runs the same source as scripts, with EVALSHA; the store switches to
// them the first time a server answers that it has no FUNCTION command.

// A scriptCall is one call of an entry point of the library.
type scriptCall struct {
	entry algo.Entry
	// args is the whole command: two places for the command and the function (or
	// script) that command fills in, the key count, the keys, then ARGV. It is built
	// once, in the slice go-redis sends (BenchmarkDecide reports the allocations).
	args []any
	ints bool // the reply is read as integers (decide without undo data)
	// cmd is the command last sent; an *redis.IntSliceCmd when ints, else a *redis.Cmd.
	cmd redis.Cmder
	// replicas is what the call's writes must reach before it is answered; when
	// Count is above 0 a WAIT follows the call on its connection, and wait holds it.
	replicas algo.Replicas
	wait     *redis.IntCmd
}

// callArgs returns the start of a call's command for keys, with room for argc more
// arguments: the command's two places, the key count and the keys.
func callArgs(keys []string, argc int) []any {
	args := make([]any, 3, 3+len(keys)+argc)
	args[2] = len(keys)
	for i := range keys {
		// A *string boxes without an allocation; go-redis writes it, and hashes it to
		// a cluster slot, as the string.
		args = append(args, &keys[i])
	}
	return args
}

// decideCall is the call of the decide entry for c.
func decideCall(c algo.Check, undo bool) *scriptCall {
	args := algo.AppendDecideArgs(callArgs(c.Keys, 4+2*len(c.Meters)), c, undo)
	sc := &scriptCall{entry: algo.EntryDecide, args: args, ints: !undo}
	if c.Cost > 0 {
		sc.replicas = c.Replicas() // a peek (cost 0) writes nothing to wait for
	}
	return sc
}

// entryCall is the call of entry e with keys and argv.
func entryCall(e algo.Entry, keys []string, argv []any) *scriptCall {
	return &scriptCall{entry: e, args: append(callArgs(keys, len(argv)), argv...)}
}

// value returns the reply of a call whose reply is not read as integers.
func (sc *scriptCall) value() (any, error) {
	cmd, ok := sc.cmd.(*redis.Cmd)
	if !ok {
		return nil, fmt.Errorf("redisstore: %s reply read as %T, want *redis.Cmd", sc.entry, sc.cmd)
	}
	return cmd.Result()
}

// answer is what the decide call sc for c answered (see decoded).
func (sc *scriptCall) answer(c algo.Check) (algo.Reply, error) {
	if cmd, ok := sc.cmd.(*redis.IntSliceCmd); ok {
		ints, err := cmd.Result()
		return decoded(c, ints, nil, err)
	}
	v, err := sc.value()
	return decoded(c, nil, v, err)
}

// decoded is the answer of a decide call for c: the call's error err, or else its
// reply, which is ints when the call was read as integers (a decision without undo
// data) and v otherwise (with undo data, or one request's element of the many
// entry's reply). Every decision, alone, in a batch or slot by slot, is read here.
func decoded(c algo.Check, ints []int64, v any, err error) (algo.Reply, error) {
	if err != nil {
		return algo.Reply{}, runError(c, err)
	}
	var rep algo.Reply
	if ints != nil {
		rep, err = algo.ParseDecideInts(ints, c.Meters)
	} else {
		rep, err = algo.ParseDecideReply(v, c.Meters)
	}
	if err != nil {
		return algo.Reply{}, fmt.Errorf("redisstore: decide %q: reply: %w", c.Keys[0], err)
	}
	return rep, nil
}

// runError is the error of a decide call for c that did not answer.
func runError(c algo.Check, err error) error {
	return fmt.Errorf("redisstore: decide %q: %w", c.Keys[0], err)
}

// exec sends calls, one command or one pipeline, and sends again once those a node
// could not run because it lacks the library (a restart without persistence, a
// FUNCTION FLUSH or SCRIPT FLUSH, a failover to a node that never had it): this is
// the one place that loads the library after the first time. A call that failed
// otherwise is never sent again, since it may have run. The calls are sent again even
// when loading failed on some node (another master of a cluster may be down): those
// whose node has the library now run; the others keep the load's error. Each call's
// command holds its own result or error.
func (s *Store) exec(ctx context.Context, calls ...*scriptCall) {
	s.execWith(ctx, nil, calls)
}

// execWith is exec with the commands in pre sent first in the same round trip; they
// are never sent again.
func (s *Store) execWith(ctx context.Context, pre []redis.Cmder, calls []*scriptCall) {
	s.send(ctx, pre, calls)
	var again []*scriptCall
	for _, sc := range calls {
		if missing(sc.cmd.Err()) {
			again = append(again, sc)
		}
	}
	if len(again) == 0 {
		return
	}
	perr := s.Preload(ctx)
	s.send(ctx, nil, again)
	for _, sc := range again {
		if perr != nil && missing(sc.cmd.Err()) {
			sc.cmd.SetErr(perr)
		}
	}
}

// send builds every call's command and sends them, after pre, in one round trip.
func (s *Store) send(ctx context.Context, pre []redis.Cmder, calls []*scriptCall) {
	cmds := pre
	for _, sc := range calls {
		sc.cmd = s.command(ctx, sc)
		cmds = append(cmds, sc.cmd)
	}
	if len(pre) == 0 && len(calls) == 1 && calls[0].replicas.Count > 0 {
		s.sendDurable(ctx, calls[0])
		return
	}
	s.pipeline(ctx, cmds)
}

// pipeline sends cmds in one round trip (a command on its own when there is one);
// each keeps its own result or error (Exec's is the first of them).
func (s *Store) pipeline(ctx context.Context, cmds []redis.Cmder) {
	if len(cmds) == 1 {
		_ = s.client.Process(ctx, cmds[0])
		return
	}
	pipe := s.client.Pipeline()
	for _, c := range cmds {
		_ = pipe.Process(ctx, c)
	}
	_, _ = pipe.Exec(ctx)
}

// sendDurable sends sc and, in the same pipeline on the same connection, WAIT for
// the replicas it asks for: WAIT blocks until that connection's writes so far reach
// them, so it must follow the call on the node that ran it (in a cluster, the master
// of the call's slot; go-redis would send a command without keys to any node). The
// pair is one round trip; the node answers it once the replicas acknowledge or the
// timeout passes.
func (s *Store) sendDurable(ctx context.Context, sc *scriptCall) {
	var node redis.Cmdable = s.client
	if s.cc != nil {
		key, _ := sc.args[3].(*string) // callArgs puts the first key there
		if key == nil {
			sc.cmd.SetErr(fmt.Errorf("redisstore: %s call without a key cannot wait for replicas", sc.entry))
			return
		}
		c, err := s.cc.MasterForKey(ctx, *key)
		if err != nil {
			sc.cmd.SetErr(fmt.Errorf("redisstore: find the master of %q: %w", *key, err))
			return
		}
		node = c
	}
	pipe := node.Pipeline()
	_ = pipe.Process(ctx, &keptCmd{Cmder: sc.cmd})
	sc.wait = redis.NewIntCmd(ctx, "wait", sc.replicas.Count, sc.replicas.Timeout.Milliseconds())
	_ = pipe.Process(ctx, sc.wait)
	_, _ = pipe.Exec(ctx)
}

// A keptCmd keeps the reply of its command once read: go-redis gives every command of
// a pipeline the pipeline's error when one read fails, so a WAIT that the client's
// read deadline cuts off would otherwise take away the decision that came before it.
// The decision was made and charged on the master; it stands. (Redis 7.0 fires a
// WAIT's timeout on its next cron tick when it is otherwise idle, up to 1000/hz ms
// late: a WAIT on a master without its replicas can outlast the client's deadline.)
type keptCmd struct {
	redis.Cmder
	read bool // the reply was read
}

// SetErr sets the command's error until its reply has been read without one.
func (k *keptCmd) SetErr(err error) {
	if k.read {
		return
	}
	k.read = err == nil
	k.Cmder.SetErr(err)
}

// waited reports whether sc's charge reached the replicas it asked for, counting it
// in s.unreplicated when it did not. A call that asks for none reached them.
func (s *Store) waited(sc *scriptCall) bool {
	if sc.replicas.Count == 0 || sc.wait == nil {
		return true
	}
	if n, err := sc.wait.Result(); err == nil && n >= int64(sc.replicas.Count) {
		return true
	}
	s.unreplicated.Add(1)
	return false
}

// command returns the FCALL (or, without Redis Functions, the EVALSHA) of sc.
func (s *Store) command(ctx context.Context, sc *scriptCall) redis.Cmder {
	if s.noFunctions.Load() {
		sc.args[0], sc.args[1] = "evalsha", s.scripts[sc.entry].Hash()
	} else {
		sc.args[0], sc.args[1] = "fcall", s.functions[sc.entry]
	}
	if sc.ints {
		cmd := redis.NewIntSliceCmd(ctx, sc.args...)
		cmd.SetFirstKeyPos(3)
		return cmd
	}
	cmd := redis.NewCmd(ctx, sc.args...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// missing reports whether err says that the node lacks the library: the function
// (or, without Redis Functions, the script) is unknown, or FCALL itself is.
func missing(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	return redis.HasErrorPrefix(reply, "NOSCRIPT") || redis.HasErrorPrefix(reply, "Function not found") || unknownCommand(reply)
}

// unknownCommand reports whether err is a server's answer to a command it does not
// have.
func unknownCommand(err error) bool {
	return err != nil && strings.Contains(strings.ToLower(err.Error()), "unknown command")
}

// Preload loads the library on every node (every master of a cluster), so the first
// decisions need no second round trip, and compares this process's clock with the
// server's (checkClock). Decisions load it by themselves on a node that
// lacks it; Preload also tells a store whose server cannot run it.
func (s *Store) Preload(ctx context.Context) error {
	if _, err := s.checkClock(ctx); err != nil {
		return fmt.Errorf("redisstore: compare the clocks: %w", err)
	}
	if s.cc == nil {
		return s.load(ctx, s.client)
	}
	functions := !s.noFunctions.Load()
	err := s.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return s.load(ctx, c) })
	if err == nil && functions && s.noFunctions.Load() {
		// A master had no FUNCTION: the masters that loaded the library need the
		// scripts too.
		err = s.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return s.load(ctx, c) })
	}
	return err
}

// load loads the library on one node: FUNCTION LOAD, or SCRIPT LOAD of each entry's
// script where the server has no FUNCTION. It asks first, with a small command,
// whether the node has the library (its name is a digest of its code, so it is the
// same code): a node that has it is sent nothing, and a connection the node refuses
// (a password not given) gets its NOAUTH answer there, where Redis 7 would close it
// without one on receiving the library's 30 KB unauthenticated.
func (s *Store) load(ctx context.Context, c redis.Cmdable) error {
	has, err := s.loaded(ctx, c)
	if err != nil {
		return fmt.Errorf("redisstore: look for the Lua library %s: %w", s.lua.Name, err)
	}
	if has {
		return nil
	}
	if !s.noFunctions.Load() {
		err := c.FunctionLoad(ctx, s.lua.FunctionSource()).Err()
		if err == nil || redis.HasErrorPrefix(err, "Library '"+s.lua.Name+"' already exists") {
			return nil
		}
		if !unknownCommand(err) {
			return fmt.Errorf("redisstore: load the Lua library %s: %w", s.lua.Name, err)
		}
		s.noFunctions.Store(true)
	}
	for _, e := range algo.Entries {
		if err := s.scripts[e].Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("redisstore: load the %s script: %w", e, err)
		}
	}
	return nil
}

// loaded reports whether one node has the library.
func (s *Store) loaded(ctx context.Context, c redis.Cmdable) (bool, error) {
	if !s.noFunctions.Load() {
		libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: s.lua.Name}).Result()
		if err == nil || !unknownCommand(err) {
			return len(libs) > 0, err
		}
		return false, nil // load finds out that there is no FUNCTION
	}
	for _, e := range algo.Entries {
		ok, err := s.scripts[e].Exists(ctx, c).Result()
		if err != nil || len(ok) == 0 || !ok[0] {
			return false, err
		}
	}
	return true, nil
}
