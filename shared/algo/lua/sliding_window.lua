-- sliding_window: two aligned window counters; the estimate of the last period is
-- prev * (period - elapsed) / period + cur. O(1) memory, approximate.
-- KEYS: the meter key K, a hash {w: current window, c: its count, p: previous count}.
-- Limit (one, see prelude.lua): count, period_us, capacity (= count), 0.
-- Reply: one decision.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the end of the window after the current one.
local function sw_reset(w, p, now, cur, prev)
  if cur > 0 then return (w + 2) * p - now end
  if prev > 0 then return (w + 1) * p - now end
  return 0
end

A.sliding_window = algorithm({
  check = function(key, now, cost, lim, record, out, o)
    local n, p = lim[1], lim[2]
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
    if est + cost > n then
      local retry
      if cost > n then
        retry = p
      elseif cur + cost <= n then
        retry = max(1, ceil(p - (n - cur - cost) * p / prev) - e)
      else
        local t = 0
        if cur > 0 then t = max(0, ceil(p - (n - cost) * p / cur)) end
        retry = (w + 1) * p - now + t
      end
      local reset = sw_reset(w, p, now, cur, prev)
      if reset > 0 then reset = reset + shift end
      if retry > 0 and cost <= n then retry = retry + shift end
      put(out, o, 0, max(0, floor(n - est)), reset, retry, 0)
      -- what a settlement (which charges anyway) commits
      return false, w, cur, prev, now
    end
    local reset = sw_reset(w, p, now, cur + cost, prev)
    if reset > 0 then reset = reset + shift end
    put(out, o, 1, floor(n - est - cost), reset, 0, 0)
    -- commit's times count from the decision's now, which a shift moved
    return true, w, cur, prev, now
  end,
  commit = function(key, now, cost, lim, record, w, cur, prev, at)
    if cost == 0 then return end
    local p = lim[2]
    redis.call('HSET', key, 'w', string.format('%d', w), 'c', cur + cost, 'p', prev)
    redis.call('PEXPIRE', key, ttl((w + 2) * p - at))
  end,
  refund = function(key, now, cost, lim)
    local w = floor(now / lim[2])
    local st = redis.call('HMGET', key, 'w', 'c', 'p')
    if not st[1] then return end
    local sw = tonumber(st[1])
    if sw == w then
      redis.call('HSET', key, 'c', max(0, tonumber(st[2]) - cost))
    elseif sw == w + 1 then
      redis.call('HSET', key, 'p', max(0, tonumber(st[3]) - cost))
    end
  end,
})
