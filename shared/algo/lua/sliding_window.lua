-- sliding_window: two aligned window counters; the estimate of the last period is
-- prev * (period - elapsed) / period + cur. O(1) memory, approximate.
-- KEYS: the meter key K, a hash {w: current window, c: its count, p: previous count}.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the end of the window after the current one.
A.sliding_window = {}
local function sw_reset(w, p, now, cur, prev)
  if cur > 0 then return (w + 2) * p - now end
  if prev > 0 then return (w + 1) * p - now end
  return 0
end
function A.sliding_window.check(key, now, cost, lims)
  local n, p = lims[1][1], lims[1][2]
  local w = floor(now / p)
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  local shift = 0
  if st[1] and tonumber(st[1]) > w then
    -- the caller's clock is behind the stored window: decide at its start, and
    -- count the times from the caller's now (shift, added at the end)
    w = tonumber(st[1])
    shift = w * p - now
    now = w * p
  end
  local e = now - w * p
  local cur, prev = 0, 0
  if st[1] then
    local sw = tonumber(st[1])
    if sw == w then
      cur, prev = tonumber(st[2]), tonumber(st[3])
    elseif sw == w - 1 then
      prev = tonumber(st[2])
    end
  end
  local est = prev * (p - e) / p + cur
  local d = {0, 0, 0, 0, 0}
  if est + cost > n then
    d[REMAINING] = max(0, floor(n - est))
    if cost > n then
      d[RETRY_US] = p
    elseif cur + cost <= n then
      local t = ceil(p - (n - cur - cost) * p / prev)
      d[RETRY_US] = max(1, t - e)
    else
      local t = 0
      if cur > 0 then t = max(0, ceil(p - (n - cost) * p / cur)) end
      d[RETRY_US] = (w + 1) * p - now + t
    end
    d[RESET_US] = sw_reset(w, p, now, cur, prev)
    if d[RESET_US] > 0 then d[RESET_US] = d[RESET_US] + shift end
    if d[RETRY_US] > 0 and cost <= n then d[RETRY_US] = d[RETRY_US] + shift end
    return {d}
  end
  d[ALLOWED] = 1
  d[REMAINING] = floor(n - est - cost)
  d[RESET_US] = sw_reset(w, p, now, cur + cost, prev)
  if d[RESET_US] > 0 then d[RESET_US] = d[RESET_US] + shift end
  return {d}, function()
    if cost == 0 then return {} end
    redis.call('HSET', key, 'w', string.format('%d', w), 'c', cur + cost, 'p', prev)
    redis.call('PEXPIRE', key, ttl((w + 2) * p - now))
    return {}
  end, {key}
end
function A.sliding_window.refund(key, now, cost, lims)
  local w = floor(now / lims[1][2])
  local st = redis.call('HMGET', key, 'w', 'c', 'p')
  if not st[1] then return end
  local sw = tonumber(st[1])
  if sw == w then
    redis.call('HSET', key, 'c', max(0, tonumber(st[2]) - cost))
  elseif sw == w + 1 then
    redis.call('HSET', key, 'p', max(0, tonumber(st[3]) - cost))
  end
end
