-- token_bucket: up to capacity tokens, refilled at count per period continuously; a
-- request takes cost tokens. An absent key is a full bucket.
-- KEYS: the meter key K, a hash {t: tokens, s: time of the last refill (us), e: the
-- time the bucket is full (us), when the state ends}. A state read at or after e is an
-- absent key (a full bucket), as the Go model reads it: the key's TTL ends near e, but
-- rounded to milliseconds (and a second later on a caller's clock), and a reload that
-- raises the count or burst (the key stays, see algo.MeterID) would otherwise read the
-- bucket as not yet full in that gap, where the model reads it full.
-- Limit (one, see prelude.lua): count, period_us, capacity, 0.
-- Reply: one decision; reset_after is the time to a full bucket.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the time the bucket needs to refill completely.
A.token_bucket = algorithm({
  check = function(key, now, cost, lim, record, out, o)
    local n, p, b = lim[1], lim[2], lim[3]
    local st = redis.call('HMGET', key, 't', 's', 'e')
    local tokens, last = b, now
    if st[1] and not (st[3] and tonumber(st[3]) <= now) then tokens, last = tonumber(st[1]), tonumber(st[2]) end
    local elapsed = max(0, now - last)
    -- a request timed before the last refill waits for refills from that refill on
    local ahead = max(0, last - now)
    local avail = min(b, tokens + elapsed * n / p)
    if avail < cost then
      local retry = p
      if cost <= b then retry = ceil_us(ahead + (cost - avail) * p / n) end
      put(out, o, 0, max(0, floor(avail)), ceil_us(ahead + (b - avail) * p / n), retry, 0)
      -- what a settlement (which charges anyway) commits: the tokens go below zero
      local left = avail - cost
      return false, left, max(now, last), ceil_us(ahead + (b - left) * p / n)
    end
    local left = avail - cost
    local reset = ceil_us(ahead + (b - left) * p / n)
    put(out, o, 1, floor(left), reset, 0, 0)
    return true, left, max(now, last), reset
  end,
  commit = function(key, now, cost, lim, record, left, last, reset)
    if cost == 0 then return end
    redis.call('HSET', key, 't', num(left), 's', num(last), 'e', string.format('%d', now + max(reset, 1)))
    redis.call('PEXPIRE', key, ttl(reset))
  end,
  refund = function(key, now, cost, lim, extra)
    local n, p, b = lim[1], lim[2], lim[3]
    local st = redis.call('HMGET', key, 't', 's')
    if not st[1] then return end
    -- Refill since the charge may have hit the capacity, where the charge's tokens
    -- would have been lost anyway: give back only what refill has not made up for.
    local give = cost - max(0, tonumber(st[2]) - now) * n / p
    if give > 0 then redis.call('HSET', key, 't', num(min(b, tonumber(st[1]) + give))) end
  end,
})
