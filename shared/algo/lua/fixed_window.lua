-- fixed_window: a counter per window aligned to the Unix epoch.
-- KEYS: the meter key K. State: K:<w> (an integer) and, when the meter records,
-- K:<w>:r (hash: recorded value -> units). Both derive from K and keep its hash tag,
-- so they live in K's cluster slot. The count is read and written in the same call
-- as the decision, so the check-then-INCR race cannot happen.
-- Limit (one, see prelude.lua): count, period_us, capacity (= count), and the
-- start of a calendar window (0: aligned to the epoch).
-- Reply: one decision; retry_after is the window's end, or a period when cost > count.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the end of the window.
-- A calendar window (its start > 0; its period the window's length) is named by its
-- start, K:c<start>; a now before it counts in it, one after it in the window of the
-- same length that follows.
local function fw_window(key, now, p, off)
  if off > 0 then
    local w = off + max(0, floor((now - off) / p)) * p
    return key .. ':c' .. string.format('%d', w), w + p
  end
  local w = floor(now / p)
  return key .. ':' .. string.format('%d', w), (w + 1) * p
end

-- fw_decide decides cost units on a window that holds used and ends at e.
local function fw_decide(n, p, used, cost, e, now, out, o)
  if used + cost > n then
    local reset, retry = e - now, e - now
    if cost > n then retry = p end
    if used == 0 then reset = 0 end
    put(out, o, 0, max(0, n - used), reset, retry, 0)
    return false
  end
  local reset = e - now
  if used + cost == 0 then reset = 0 end
  put(out, o, 1, n - used - cost, reset, 0, 0)
  return true
end

A.fixed_window = algorithm({
  check = function(key, now, cost, lim, record, out, o)
    local n, p = lim[1], lim[2]
    local k, e = fw_window(key, now, p, lim[4])
    local used = tonumber(redis.call('GET', k) or '0')
    return fw_decide(n, p, used, cost, e, now, out, o), k, e, used
  end,
  commit = function(key, now, cost, lim, record, k, e, used)
    if cost == 0 then return end
    -- the count was read in this same call: SET ... PX leaves what INCRBY and PEXPIRE
    -- would, in one command
    redis.call('SET', k, string.format('%d', used + cost), 'PX', ttl(e - now))
    if record ~= '' then
      redis.call('HINCRBY', k .. ':r', record, cost)
      redis.call('PEXPIRE', k .. ':r', ttl(e - now))
    end
  end,
  writes = function(key, now, lim, record)
    local k = fw_window(key, now, lim[2], lim[4])
    if record ~= '' then return {k, k .. ':r'} end
    return {k}
  end,
  refund = function(key, now, cost, lim, extra, record)
    local k = fw_window(key, now, lim[2], lim[4])
    if redis.call('EXISTS', k) == 1 and redis.call('DECRBY', k, cost) <= 0 then
      redis.call('DEL', k)
    end
    if record ~= '' and redis.call('EXISTS', k .. ':r') == 1 and redis.call('HINCRBY', k .. ':r', record, -cost) <= 0 then
      redis.call('HDEL', k .. ':r', record)
    end
  end,
})
