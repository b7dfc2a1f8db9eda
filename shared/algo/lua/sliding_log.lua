-- sliding_log: one sorted-set entry per admitted cost unit, scored by its admission
-- time (microseconds); an entry counts while score > now - period. Exact.
-- KEYS: the meter key K (a sorted set). Members are "<time>:<seq>[:<record>]", unique
-- because seq continues the count of live entries at that time.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: the period after the newest entry. check only counts (ZCOUNT); expired entries
-- are trimmed by commit, so a denied request changes nothing.
A.sliding_log = {}
function A.sliding_log.check(key, now, cost, lims, record)
  local n, p = lims[1][1], lims[1][2]
  local lo = '(' .. string.format('%d', now - p)
  local used = redis.call('ZCOUNT', key, lo, '+inf')
  local d = {0, 0, 0, 0, 0}
  local newest = 0
  if used > 0 then
    newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
    d[RESET_US] = newest + p - now
  end
  if used + cost > n then
    d[REMAINING] = max(0, n - used)
    if cost > n then
      d[RETRY_US] = p
    else
      local e = redis.call('ZRANGEBYSCORE', key, lo, '+inf', 'WITHSCORES', 'LIMIT', used + cost - n - 1, 1)
      d[RETRY_US] = tonumber(e[2]) + p - now
    end
    return {d}
  end
  d[ALLOWED] = 1
  d[REMAINING] = n - used - cost
  if cost > 0 then
    newest = max(newest, now)
    d[RESET_US] = newest + p - now
  end
  return {d}, function()
    if cost == 0 then return {} end
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
  end, {key}
end
function A.sliding_log.refund(key, now, cost, lims, extra)
  if #extra > 0 then redis.call('ZREM', key, unpack(extra)) end
end
