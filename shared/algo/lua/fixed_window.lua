-- fixed_window: a counter per window aligned to the Unix epoch.
-- KEYS: the meter key K. State: K:<w> (integer string, written with its TTL in the
-- same call as the read, so the check-then-INCR race cannot happen) and, when the meter
-- records, K:<w>:r (hash: recorded value -> units). Both derive from K and keep its
-- hash tag, so they live in K's cluster slot.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the end of the window.
-- A calendar window (the limit's fourth value, otherwise 0, is its start; its period
-- the window's length) is named by its start, K:c<start>; a now before it counts in
-- it, one after it in the window of the same length that follows.
A.fixed_window = {}
local function fw_window(key, now, lims)
  local p, off = lims[1][2], lims[1][4]
  if off > 0 then
    local w = off + max(0, floor((now - off) / p)) * p
    return key .. ':c' .. string.format('%d', w), w + p
  end
  local w = floor(now / p)
  return key .. ':' .. string.format('%d', w), (w + 1) * p
end
function A.fixed_window.check(key, now, cost, lims, record)
  local n, p = lims[1][1], lims[1][2]
  local k, e = fw_window(key, now, lims)
  local used = tonumber(redis.call('GET', k) or '0')
  local d = {0, 0, e - now, 0, 0}
  if used + cost > n then
    d[REMAINING] = max(0, n - used)
    d[RETRY_US] = e - now
    if cost > n then d[RETRY_US] = p end
    if used == 0 then d[RESET_US] = 0 end
    return {d}
  end
  d[ALLOWED] = 1
  d[REMAINING] = n - used - cost
  if used + cost == 0 then d[RESET_US] = 0 end
  local writes = {k}
  if record ~= '' then writes[2] = k .. ':r' end
  return {d}, function()
    if cost == 0 then return {} end
    -- the count was read above in this same call: SET ... PX leaves what INCRBY and
    -- PEXPIRE would, in one command
    redis.call('SET', k, string.format('%d', used + cost), 'PX', ttl(e - now))
    if record ~= '' then
      redis.call('HINCRBY', k .. ':r', record, cost)
      redis.call('PEXPIRE', k .. ':r', ttl(e - now))
    end
    return {}
  end, writes
end
function A.fixed_window.refund(key, now, cost, lims, extra, record)
  local k = fw_window(key, now, lims)
  if redis.call('EXISTS', k) == 1 and redis.call('DECRBY', k, cost) <= 0 then
    redis.call('DEL', k)
  end
  if record ~= '' and redis.call('EXISTS', k .. ':r') == 1 and redis.call('HINCRBY', k .. ':r', record, -cost) <= 0 then
    redis.call('HDEL', k .. ':r', record)
  end
end
