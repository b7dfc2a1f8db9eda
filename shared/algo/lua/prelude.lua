-- tollgate: the helpers every algorithm file uses. Package algo joins prelude.lua,
-- one file per algorithm, then library.lua into one source: a Redis Functions library
-- (FUNCTION LOAD once per node, FCALL per call), or the same source run by EVALSHA
-- where the server has no FUNCTION. Nothing here runs at load but definitions.
--
-- Numbers: times are Unix microseconds, whole numbers below 2^53, exact in Lua's
-- doubles. Fractions (tokens, a TAT with a fractional emission interval) are stored
-- with %.17g so they read back to the same double; whole numbers as integers.
--
-- Every algorithm A.<name> is a table with
--   check(key, now, cost, lims, record) -> decisions, commit, writes
--     decisions: one {allowed 0|1, remaining, reset_after_us, retry_after_us, delay_us}
--                per limit; commit (nil when denied) writes the new state and returns
--                the extra data a refund needs (a list of strings); writes lists the
--                keys commit may write
--   refund(key, charged_now, cost, lims, extra, record, refund_now) undoes one charge
--     logically, never giving back more than the charge still weighs: refill that
--     happened since the charge already made up for part of it
-- lims is a list of {count, period_us, capacity, bucket_us}. check only reads.
local A = {}
-- The fields of a decision tuple, {allowed 0|1, remaining, reset_after_us,
-- retry_after_us, delay_us}, as the reply lists them.
local ALLOWED, REMAINING, RESET_US, RETRY_US, DELAY_US = 1, 2, 3, 4, 5
local floor, ceil, max, min = math.floor, math.ceil, math.max, math.min

local function num(x)
  if x == floor(x) then return string.format('%d', x) end
  return string.format('%.17g', x)
end

-- ttl_slack is added to every TTL when the caller passed the time: a caller's clock
-- may run slower than the server's, and a key must not expire on the server before
-- the caller's time says it should. library.lua sets it for every request before any
-- algorithm runs (Redis runs one call at a time), so no call sees another's.
local ttl_slack = 0

-- ttl converts microseconds to a PEXPIRE argument: whole ms, rounded up, at least 1.
local function ttl(us)
  local ms = ceil((us + ttl_slack) / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- ceil_us rounds a non-negative microsecond amount up; negative becomes 0.
local function ceil_us(x)
  if x <= 0 then return 0 end
  return ceil(x)
end
