-- gcra: the generic cell rate algorithm, one theoretical arrival time (TAT) per key.
-- Each cost unit moves the TAT by T = period / count; admitted while the new TAT is at
-- most capacity * T ahead of now.
-- KEYS: the meter key K, a string: the TAT in microseconds (an integer when whole).
-- Limit (one, see prelude.lua): count, period_us, capacity, 0.
-- Reply: one decision; delay is 0 (leaky_bucket reports one).
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the TAT.
-- The arithmetic is relative to now (rel = TAT - now), where doubles are exact far
-- below a microsecond; a new TAT may pass the allowance by tat_slack (1 us) to absorb
-- the quarter-microsecond rounding of an absolute TAT.
local tat_slack = 1
-- times derived from a TAT are rounded up after taking off its quarter-microsecond grid
local function ceil_tat(x) return ceil_us(x - 0.25) end

-- gcra_check returns gcra's check, or with shape leaky_bucket's, which reports the
-- wait before the TAT as delay. It returns allowed, the new TAT - now and the reset,
-- which commit writes.
local function gcra_check(shape)
  return function(key, now, cost, lim, record, out, o)
    local n, p, b = lim[1], lim[2], lim[3]
    local t = p / n
    local rel = 0
    local v = redis.call('GET', key)
    if v then rel = max(0, tonumber(v) - now) end
    local new_rel = rel + cost * t
    local burst = b * t
    if new_rel > burst + tat_slack then
      local retry = p
      if cost <= b then retry = ceil_tat(new_rel - burst) end
      put(out, o, 0, max(0, floor((burst - rel + tat_slack) / t)), ceil_tat(rel), retry, 0)
      -- what a settlement (which charges anyway) commits: the TAT past the burst
      return false, new_rel, ceil_tat(new_rel)
    end
    local delay, reset = 0, ceil_tat(new_rel)
    if shape then delay = ceil_tat(rel) end
    put(out, o, 1, max(0, floor((burst - new_rel + tat_slack) / t)), reset, 0, delay)
    return true, new_rel, reset
  end
end

-- gcra_commit writes the TAT; the key lives until the reset reported (the TAT on the
-- quarter-microsecond grid).
local function gcra_commit(key, now, cost, lim, record, new_rel, reset)
  if cost > 0 then redis.call('SET', key, num(now + new_rel), 'PX', ttl(reset)) end
end

local function gcra_refund(key, now, cost, lim, extra, record, refund_now)
  local v = redis.call('GET', key)
  if not v then return end
  -- The charge moved the TAT by cost * T; the time since the charge may already have
  -- passed part of that (the TAT would have been caught up by now anyway).
  local give = cost * (lim[2] / lim[1]) - max(0, refund_now - now)
  if give > 0 then
    redis.call('SET', key, num(max(refund_now, tonumber(v) - give)), 'KEEPTTL')
  end
end

-- gcra_meter is the algorithm table of gcra, or with shape of leaky_bucket.
local function gcra_meter(shape)
  return algorithm({check = gcra_check(shape), commit = gcra_commit, refund = gcra_refund})
end

A.gcra = gcra_meter(false)
