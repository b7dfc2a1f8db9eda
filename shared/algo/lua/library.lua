-- library: the entry points, which run the algorithms above for a lone request
-- (decide), several independent requests in one call (many) and the refund of a charge
-- (refund). Package algo appends the lines that make them callable: one
-- redis.register_function per entry for the Functions library (FCALL <library>_<entry>),
-- or `return E.<entry>(KEYS, ARGV)` for the EVALSHA of the same source. Each entry
-- binds the standard functions (prelude.lua's bind) on its first call.
--
-- decide: every meter of one request, all-or-nothing, in one round trip.
--   KEYS[i]: the key of meter i (all in one cluster slot).
--   ARGV: now_us ('' = the server's clock; a caller's clock adds one second to every
--     TTL, see prelude.lua), cost (a whole number), undo (1: reply with what a
--     refund needs), meter count M, then per meter: its spec (see spec below) and its record ('' = none).
--   Reply: {now_us, allowed (0|1), then per meter per limit: allowed, remaining,
--     reset_after_us, retry_after_us, delay_us}; with undo, then per charged meter:
--     meter index (from 0), key count, then per key: name, dump before ('' = absent),
--     pexpiretime before (ms, -2 = absent), dump after ('' = absent); extra count,
--     extra... Without undo every element is a number (never nil or false): the Go
--     side reads the reply as integers.
--   Every meter is checked (read-only) first; only when no non-shadow meter denies are
--   the meters that allow charged. A shadow meter that denies is reported, not charged.
--
-- many: several independent requests, each decided as decide decides it (all-or-nothing
--   within a request, never across requests). The requests' keys must all be on this
--   node. One call saves Redis the dispatch of each command and the setup of each call.
--   KEYS: every request's keys, request after request: one per meter.
--   ARGV: request count R, then per request decide's ARGV (4 + 2 per meter).
--   Time: the server's clock is read at most once for the whole batch.
--   Reply: R elements, each decide's reply to that request, or an error reply when the
--     request failed (the other requests are unaffected).
--
-- refund: undo the charge of a decide call (made with undo) whose request a later
--   cluster slot denied.
--   KEYS: per meter, its key then the keys its commit wrote (all in one cluster slot).
--   ARGV: charged_now_us, refund_now_us ('' = the server's clock), cost, meter count M,
--     then per meter: its spec, its record, key count K, K times {dump before ('' =
--     absent), pexpiretime before (ms, -2 = absent), dump after ('' = absent)}, extra
--     count E, E extra values (from decide's undo).
--   For each meter: when every key it wrote still holds exactly the bytes the charge
--   left, the keys are restored byte for byte (RESTORE ... ABSTTL, or DEL where the key
--   was absent); when anything else wrote them since, the algorithm's own inverse gives
--   the units back instead, so a refund never loses another request's charge.
--   Reply: the number of meters restored byte for byte.

-- A meter's spec is one argument: its algorithm, shadow (0|1), then per limit count,
-- period_us, capacity and bucket_us (whole numbers), separated by single spaces, e.g.
-- "gcra 0 100 1000000 100 0". The same meters come back call after call, so a spec is
-- parsed once and kept: a call then finds its meter's numbers with one lookup instead
-- of receiving and converting (strtod) four arguments more per limit
-- (BenchmarkScriptCost in shared/redisstore, which make bench-core runs). The table
-- lives as long as the Functions library on the node; it holds at most max_specs
-- entries and starts over when full, so a stream of distinct limits (Envoy's
-- per-descriptor overrides) cannot grow it without bound. What it holds is derived
-- from the arguments alone, so a node answers the same with or without it. Under
-- EVALSHA (a server without FUNCTION, miniredis) the source runs afresh on every call
-- and so does the parse.
local max_specs = 4096
local specs, nspecs = {}, 0

-- spec returns the parsed spec s: {algo = A[<algorithm>], shadow = bool, nl = limit
-- count, [1..4 * nl] = the limits' numbers}, or nil and an error reply when s is not
-- a valid spec.
local function spec(s)
  local sp = specs[s]
  if sp then return sp end
  local name, shadow, rest = string.match(s or '', '^([%w_]+) ([01])( .*)$')
  if not name then
    return nil, redis.error_reply('tollgate: malformed meter spec ' .. string.format('%q', tostring(s)) .. ': want an algorithm, 0 or 1, then four numbers per limit')
  end
  local algo = A[name]
  if not algo then
    return nil, redis.error_reply('tollgate: unknown algorithm ' .. string.format('%q', name) .. ' in meter spec')
  end
  local n, ok = 0, true
  sp = {}
  for w in string.gmatch(rest, ' ([^ ]*)') do
    local x = tonumber(w)
    if not x or x < 0 or x >= 9007199254740992 or x ~= floor(x) then ok = false end
    n = n + 1
    sp[n] = x
  end
  if not ok or n % 4 ~= 0 then
    return nil, redis.error_reply('tollgate: malformed limits in meter spec ' .. string.format('%q', s) .. ': want four whole numbers per limit')
  end
  sp.algo, sp.shadow, sp.nl = algo, shadow == '1', n / 4
  if nspecs >= max_specs then specs, nspecs = {}, 0 end
  specs[s], nspecs = sp, nspecs + 1
  return sp
end

-- server_now reads the server's clock in Unix microseconds. The seconds' text changes
-- once a second: converting it once then, not on every call, saves a strtod per call
-- (BenchmarkScriptCost).
local last_sec, last_sec_us = nil, 0
local function server_now()
  local t = redis.call('TIME')
  if t[1] ~= last_sec then last_sec, last_sec_us = t[1], tonumber(t[1]) * 1000000 end
  return last_sec_us + tonumber(t[2])
end

-- small converts an argument that is usually 1 (a cost, a meter count) without a
-- strtod when it is (BenchmarkScriptCost).
local function small(s)
  if s == '1' then return 1 end
  return tonumber(s)
end

-- charge runs the commit of meter i (parsed spec sp, record) with the state its check
-- returned; with undo, every key it may write is dumped before and after, so that a
-- refund can restore the bytes exactly when nothing else touched them in between, and
-- meter i's undo record is appended to out.
local function charge(out, undo, i, sp, record, key, now, cost, s1, s2, s3, s4)
  local algo = sp.algo
  if not undo then
    algo.commit(key, now, cost, sp, record, s1, s2, s3, s4)
    return
  end
  local writes = algo.writes(key, now, sp, record)
  local before, expires = {}, {}
  for k = 1, #writes do
    before[k] = redis.call('DUMP', writes[k]) or ''
    expires[k] = redis.call('PEXPIRETIME', writes[k])
  end
  local extra = algo.commit(key, now, cost, sp, record, s1, s2, s3, s4) or {}
  out[#out + 1] = i - 1
  out[#out + 1] = #writes
  for k = 1, #writes do
    out[#out + 1] = writes[k]
    out[#out + 1] = before[k]
    out[#out + 1] = expires[k]
    out[#out + 1] = redis.call('DUMP', writes[k]) or ''
  end
  out[#out + 1] = #extra
  for k = 1, #extra do out[#out + 1] = extra[k] end
end

-- request decides one request: its keys from keys[k0 + 1] on, its ARGV (decide's)
-- from args[a0 + 1] on; server is the server's clock when the caller read it already.
-- It returns decide's reply, or an error reply for a meter spec it cannot read.
local function request(keys, k0, args, a0, server)
  local now
  if args[a0 + 1] == '' then
    now = server or server_now()
    ttl_slack = 0
  else
    now = tonumber(args[a0 + 1])
    ttl_slack = 1000000
  end
  local cost = small(args[a0 + 2])
  local undo = args[a0 + 3] == '1'
  local m = small(args[a0 + 4])
  local pos = a0 + 5
  if m == 1 and not undo then
    -- one meter: nothing else can deny, so it is charged as soon as it allows
    local sp, err = spec(args[pos])
    if not sp then return err end
    local algo, key, record = sp.algo, keys[k0 + 1], args[pos + 1]
    -- the reply of one limit, in one allocation; check fills in the decision
    local out = {now, 1, 0, 0, 0, 0, 0}
    local ok, s1, s2, s3, s4 = algo.check(key, now, cost, sp, record, out, 2)
    if ok then algo.commit(key, now, cost, sp, record, s1, s2, s3, s4) end
    if not ok and not sp.shadow then
      out[2] = 0
    end
    return out
  end
  -- several meters (or undo data): check every meter, then charge the meters that
  -- allow only when no meter that is not a shadow denies
  local out, pending = {now, 1}, {}
  for i = 1, m do
    local sp, err = spec(args[pos])
    if not sp then return err end
    local record = args[pos + 1]
    local ok, s1, s2, s3, s4 = sp.algo.check(keys[k0 + i], now, cost, sp, record, out, #out)
    if ok then
      pending[#pending + 1] = {i, sp, record, s1, s2, s3, s4}
    elseif not sp.shadow then
      out[2] = 0
    end
    pos = pos + 2
  end
  if out[2] == 0 then return out end
  for c = 1, #pending do
    local p = pending[c]
    charge(out, undo, p[1], p[2], p[3], keys[k0 + p[1]], now, cost, p[4], p[5], p[6], p[7])
  end
  return out
end

local E = {}

-- settle: charge every meter of one request, never refusing: a cost already spent.
--   KEYS, ARGV: decide's (undo is ignored: a settlement is never refunded).
--   Each meter's check runs for the state its commit needs, the commit runs whether
--   the check allowed or not (a meter may go past its limit: a debt that later
--   requests pay back as the algorithm gives units back), then a peek (cost 0)
--   reports the meter after the charge.
--   Reply: decide's without undo; every decision allowed 1 (the charge landed), its
--     remaining and reset_after read after the charge (remaining 0 while in debt,
--     reset_after when the debt is paid and the limit full), retry_after and delay 0.
--   A sliding_log meter cannot settle (its log would grow past the limit without
--   bound): the call fails before it charges anything.
function E.settle(keys, args)
  if not floor then bind() end
  local now
  if args[1] == '' then
    now = server_now()
    ttl_slack = 0
  else
    now = tonumber(args[1])
    ttl_slack = 1000000
  end
  local cost = small(args[2])
  local m = small(args[4])
  local sps = {}
  for i = 1, m do
    local sp, err = spec(args[3 + 2 * i])
    if not sp then return err end
    if sp.algo == A.sliding_log then
      return redis.error_reply('tollgate: settle: sliding_log cannot settle (a debt would grow its log without bound); use sliding_window, fixed_window, token_bucket or gcra for a limit that settles')
    end
    sps[i] = sp
  end
  local out = {now, 1}
  for i = 1, m do
    local sp, record, key = sps[i], args[4 + 2 * i], keys[i]
    local o = #out
    local _, s1, s2, s3, s4 = sp.algo.check(key, now, cost, sp, record, out, o)
    if cost > 0 then sp.algo.commit(key, now, cost, sp, record, s1, s2, s3, s4) end
    sp.algo.check(key, now, 0, sp, record, out, o)
    for j = 0, sp.nl - 1 do
      out[o + 5 * j + 1], out[o + 5 * j + 4], out[o + 5 * j + 5] = 1, 0, 0
    end
  end
  return out
end

function E.decide(keys, args)
  if not floor then bind() end
  return request(keys, 0, args, 0)
end

function E.many(keys, args)
  if not floor then bind() end
  local r = tonumber(args[1])
  local out, server = {}, nil
  local kp, ap = 0, 1
  for i = 1, r do
    -- a request has as many keys as meters, and decide's 4 + 2 per meter arguments
    local m = small(args[ap + 4])
    if not m then return redis.error_reply('tollgate: many: request ' .. i .. ' has no meter count') end
    if args[ap + 1] == '' and not server then server = server_now() end
    -- a request that fails (an unknown algorithm, a key of the wrong type) fails alone
    local ok, v = pcall(request, keys, kp, args, ap, server)
    if ok or type(v) == 'table' then
      out[i] = v -- decide's reply, or an error reply (redis.call raises one)
    else
      out[i] = redis.error_reply(tostring(v))
    end
    kp, ap = kp + m, ap + 4 + 2 * m
  end
  return out
end

-- restore puts back the K keys of one meter from their snapshot, which starts at
-- args[pos]; key k of the meter is keys[kpos + k].
local function restore(keys, kpos, args, pos, nk)
  for k = 1, nk do
    local name = keys[kpos + k]
    local before, exp = args[pos + (k - 1) * 3], tonumber(args[pos + (k - 1) * 3 + 1])
    if before == '' then
      redis.call('DEL', name)
    elseif exp > 0 then
      redis.call('RESTORE', name, exp, before, 'REPLACE', 'ABSTTL')
    else
      redis.call('RESTORE', name, 0, before, 'REPLACE')
    end
  end
end

function E.refund(keys, args)
  if not floor then bind() end
  local now = tonumber(args[1])
  local refund_now = tonumber(args[2]) or server_now()
  local cost = tonumber(args[3])
  local pos, kpos, exact = 5, 1, 0
  for _ = 1, tonumber(args[4]) do
    local sp, err = spec(args[pos])
    if not sp then return err end
    local record = args[pos + 1]
    local nk = tonumber(args[pos + 2])
    pos = pos + 3
    -- a charge without undo keys (a lease's units, given back later) always takes
    -- the inverse
    local same = nk > 0
    for k = 1, nk do
      if (redis.call('DUMP', keys[kpos + k]) or '') ~= args[pos + (k - 1) * 3 + 2] then same = false end
    end
    local ne = tonumber(args[pos + nk * 3])
    local extra = {}
    for e = 1, ne do extra[e] = args[pos + nk * 3 + e] end
    if same then
      restore(keys, kpos, args, pos, nk)
      exact = exact + 1
    else
      sp.algo.refund(keys[kpos], now, cost, sp, extra, record, refund_now)
    end
    pos = pos + nk * 3 + 1 + ne
    kpos = kpos + 1 + nk
  end
  return exact
end
