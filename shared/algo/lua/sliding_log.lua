-- sliding_log: one sorted-set entry per admitted cost unit, scored by its admission
-- time (microseconds); an entry counts while score > now - period. Exact.
-- KEYS: the meter key K (a sorted set). Members are "<time>:<seq>[:<record>]", unique
-- because seq continues the count of live entries at that time.
-- Limit (one, see prelude.lua): count, period_us, capacity (= count), 0.
-- Reply: one decision; a refund's extra data are the members a charge added.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the period after the newest entry. check only counts (ZCOUNT); expired entries
-- are trimmed by commit, so a denied request changes nothing.
A.sliding_log = algorithm({
  check = function(key, now, cost, lim, record, out, o)
    local n, p = lim[1], lim[2]
    local lo = '(' .. string.format('%d', now - p)
    local used = redis.call('ZCOUNT', key, lo, '+inf')
    local reset, newest = 0, 0
    if used > 0 then
      newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
      reset = newest + p - now
    end
    if used + cost > n then
      local retry = p
      if cost <= n then
        local e = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', used + cost - n - 1, 1)
        retry = tonumber(e[2]) + p - now
      end
      put(out, o, 0, max(0, n - used), reset, retry, 0)
      return false
    end
    if cost > 0 then
      newest = max(newest, now)
      reset = newest + p - now
    end
    put(out, o, 1, n - used - cost, reset, 0, 0)
    return true, newest
  end,
  commit = function(key, now, cost, lim, record, newest)
    if cost == 0 then return end
    local p = lim[2]
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - p))
    -- Members must be unique, or ZADD would only rescore one and lose a unit: seq
    -- starts at the live count and steps past any member that already exists (after
    -- a trim, a refund, or a clock that went back).
    local seq = redis.call('ZCARD', key)
    local members = {}
    local t = string.format('%d', now)
    for i = 1, cost do
      local m
      repeat
        seq = seq + 1
        m = t .. ':' .. seq
        if record ~= '' then m = m .. ':' .. record end
      until redis.call('ZADD', key, 'NX', t, m) == 1
      members[i] = m
    end
    redis.call('PEXPIRE', key, ttl(newest + p - now))
    return members
  end,
  refund = function(key, now, cost, lim, extra)
    if #extra > 0 then redis.call('ZREM', key, unpack(extra)) end
  end,
})
