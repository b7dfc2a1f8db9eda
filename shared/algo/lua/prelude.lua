-- tollgate: the helpers every algorithm file uses. Package algo joins prelude.lua,
-- one file per algorithm, then library.lua into one source: a Redis Functions library
-- (FUNCTION LOAD once per node, FCALL per call), or the same source run by EVALSHA
-- where the server has no FUNCTION. Loading it only defines functions.
--
-- Numbers: times are Unix microseconds, whole numbers below 2^53, exact in Lua's
-- doubles. Fractions (tokens, a TAT with a fractional emission interval) are stored
-- with %.17g so they read back to the same double; whole numbers as integers.
--
-- Every algorithm A.<name> is a table of plain functions, defined once; a call
-- allocates as little as it can (Redis pays for every table and closure of every call).
-- A meter's limits come parsed from its spec (see spec below): lim[1..4 * lim.nl] are
-- lim.nl groups of four numbers: count, period_us, capacity, bucket_us (a ring's
-- bucket, or a calendar window's start).
--   check(key, now, cost, lim, record, out, o) -> allowed, s1, s2, s3, s4
--     only reads. Writes one decision per limit into out from out[o + 1]: allowed 0|1,
--     remaining, reset_after_us, retry_after_us, delay_us. allowed (a boolean) says
--     whether the meter admits; s1..s4 are what commit needs, also when it denies (a
--     settlement commits a charge that takes the meter past its limit, into debt).
--   commit(key, now, cost, lim, record, s1, s2, s3, s4) -> extra
--     writes the charge; extra (a list of strings, or nil) is what a refund needs.
--   writes(key, now, lim, record) -> the keys commit may write (for undo).
--   refund(key, charged_now, cost, lim, extra, record, refund_now) undoes one charge
--     logically, never giving back more than the charge still weighs: refill that
--     happened since the charge already made up for part of it.
local A = {}
-- Redis 7.0 lets a library's load reach no global but redis, not even math: these are
-- bound by bind, which every entry point calls first.
local floor, ceil, max, min

local function bind()
  floor, ceil, max, min = math.floor, math.ceil, math.max, math.min
end

local function num(x)
  if x == floor(x) then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- ttl_slack is added to every TTL when the caller passed the time: a caller's clock
-- may run slower than the server's, and a key must not expire on the server before
-- the caller's time says it should. library.lua sets it for every request before any
-- algorithm runs (Redis runs one call at a time), so no call sees another's.
local ttl_slack = 0

-- ttl converts microseconds to a PEXPIRE argument: whole ms, rounded up, at least 1,
-- as text (redis.call formats a number argument with %.17g, which costs more).
local function ttl(us)
  local ms = ceil((us + ttl_slack) / 1000)
  if ms < 1 then ms = 1 end
  return string.format('%d', ms)
end

-- ceil_us rounds a non-negative microsecond amount up; negative becomes 0.
local function ceil_us(x)
  if x <= 0 then return 0 end
  return ceil(x)
end

-- put writes one decision into out from out[o + 1].
local function put(out, o, allowed, remaining, reset, retry, delay)
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = allowed, remaining, reset, retry, delay
end

-- the meter key itself: what commit writes for every algorithm of one key
local function own_key(key) return {key} end

-- algorithm completes an algorithm's table: writes defaults to the meter key.
local function algorithm(a)
  a.writes = a.writes or own_key
  return a
end
