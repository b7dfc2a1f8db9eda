-- token_bucket: up to capacity tokens, refilled at count per period continuously; a
-- request takes cost tokens. An absent key is a full bucket.
-- KEYS: the meter key K, a hash {t: tokens, s: time of the last refill (us)}.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the time the bucket needs to refill completely.
A.token_bucket = {}
function A.token_bucket.check(key, now, cost, lims)
  local n, p, b = lims[1][1], lims[1][2], lims[1][3]
  local st = redis.call('HMGET', key, 't', 's')
  local tokens, last = b, now
  if st[1] then tokens, last = tonumber(st[1]), tonumber(st[2]) end
  local elapsed = max(0, now - last)
  -- a request timed before the last refill waits for refills from that refill on
  local ahead = max(0, last - now)
  local avail = min(b, tokens + elapsed * n / p)
  local d = {0, 0, 0, 0, 0}
  if avail < cost then
    d[REMAINING] = floor(avail)
    if cost > b then d[RETRY_US] = p else d[RETRY_US] = ceil_us(ahead + (cost - avail) * p / n) end
    d[RESET_US] = ceil_us(ahead + (b - avail) * p / n)
    return {d}
  end
  local left = avail - cost
  d[ALLOWED] = 1
  d[REMAINING] = floor(left)
  d[RESET_US] = ceil_us(ahead + (b - left) * p / n)
  return {d}, function()
    if cost == 0 then return {} end
    redis.call('HSET', key, 't', num(left), 's', num(max(now, last)))
    redis.call('PEXPIRE', key, ttl(d[RESET_US]))
    return {}
  end, {key}
end
function A.token_bucket.refund(key, now, cost, lims)
  local n, p, b = lims[1][1], lims[1][2], lims[1][3]
  local st = redis.call('HMGET', key, 't', 's')
  if not st[1] then return end
  -- Refill since the charge may have hit the capacity, where the charge's tokens
  -- would have been lost anyway: give back only what refill has not made up for.
  local give = cost - max(0, tonumber(st[2]) - now) * n / p
  if give > 0 then redis.call('HSET', key, 't', num(min(b, tonumber(st[1]) + give))) end
end
