-- gcra: the generic cell rate algorithm, one theoretical arrival time (TAT) per key.
-- Each cost unit moves the TAT by T = period / count; admitted while the new TAT is at
-- most capacity * T ahead of now.
-- KEYS: the meter key K, a string: the TAT in microseconds (an integer when whole).
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the TAT.
-- The arithmetic is relative to now (rel = TAT - now), where doubles are exact far
-- below a microsecond; a new TAT may pass the allowance by tat_slack (1 us) to absorb
-- the quarter-microsecond rounding of an absolute TAT.
local tat_slack = 1
-- times derived from a TAT are rounded up after taking off its quarter-microsecond grid
local function ceil_tat(x) return ceil_us(x - 0.25) end
-- gcra_core decides: allowed (0|1), remaining, reset_after, retry_after, delay, and
-- the new TAT - now.
local function gcra_core(key, now, cost, n, p, b, shape)
  local t = p / n
  local rel = 0
  local v = redis.call('GET', key)
  if v then rel = max(0, tonumber(v) - now) end
  local new_rel = rel + cost * t
  local burst = b * t
  if new_rel > burst + tat_slack then
    local retry = p
    if cost <= b then retry = ceil_tat(new_rel - burst) end
    return 0, max(0, floor((burst - rel + tat_slack) / t)), ceil_tat(rel), retry, 0, new_rel
  end
  local delay = 0
  if shape then delay = ceil_tat(rel) end
  return 1, max(0, floor((burst - new_rel + tat_slack) / t)), ceil_tat(new_rel), 0, delay, new_rel
end
local function gcra_write(key, now, cost, new_rel)
  -- the key lives until the reset reported (the TAT on the quarter-microsecond grid)
  if cost > 0 then redis.call('SET', key, num(now + new_rel), 'PX', ttl(ceil_tat(new_rel))) end
end
local function gcra_check(key, now, cost, lims, shape)
  local ok, rem, reset, retry, delay, new_rel = gcra_core(key, now, cost, lims[1][1], lims[1][2], lims[1][3], shape)
  local d = {ok, rem, reset, retry, delay}
  if ok == 0 then return {d} end
  return {d}, function()
    gcra_write(key, now, cost, new_rel)
    return {}
  end, {key}
end
local function gcra_refund(key, now, cost, lims, extra, record, refund_now)
  local v = redis.call('GET', key)
  if not v then return end
  -- The charge moved the TAT by cost * T; the time since the charge may already have
  -- passed part of that (the TAT would have been caught up by now anyway).
  local give = cost * (lims[1][2] / lims[1][1]) - max(0, refund_now - now)
  if give > 0 then
    redis.call('SET', key, num(max(refund_now, tonumber(v) - give)), 'KEEPTTL')
  end
end
A.gcra = {
  check = function(key, now, cost, lims) return gcra_check(key, now, cost, lims, false) end,
  refund = gcra_refund,
}
