-- gcra: the generic cell rate algorithm, one theoretical arrival time (TAT) per key.
-- Each cost unit moves the TAT by T = period / count; admitted while the new TAT is at
-- most capacity * T ahead of now.
-- KEYS: the meter key K, a string: the TAT in microseconds (an integer when whole).
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the TAT.
local function gcra_check(key, now, cost, lims, shape)
  local n, p, b = lims[1][1], lims[1][2], lims[1][3]
  local t = p / n
  local tat = now
  local v = redis.call('GET', key)
  if v then tat = max(tonumber(v), now) end
  local new_tat = tat + cost * t
  local burst = b * t
  local d = {0, 0, 0, 0, 0}
  if new_tat - now > burst then
    d[2] = max(0, floor((burst - (tat - now)) / t))
    if cost > b then d[4] = p else d[4] = cus(new_tat - now - burst) end
    d[3] = cus(tat - now)
    return {d}
  end
  d[1] = 1
  d[2] = floor((burst - (new_tat - now)) / t)
  d[3] = cus(new_tat - now)
  if shape then d[5] = cus(tat - now) end
  return {d}, function()
    if cost == 0 then return {} end
    redis.call('SET', key, num(new_tat), 'PX', ttl(new_tat - now))
    return {}
  end, {key}
end
local function gcra_refund(key, now, cost, lims)
  local v = redis.call('GET', key)
  if v then
    redis.call('SET', key, num(tonumber(v) - cost * (lims[1][2] / lims[1][1])), 'KEEPTTL')
  end
end
A.gcra = {
  check = function(key, now, cost, lims) return gcra_check(key, now, cost, lims, false) end,
  refund = gcra_refund,
}
