-- bucket_ring: buckets of width W on a ring of size = longest period / W, in one hash;
-- every window of the meter (a multiple of W) is the sum of its last period/W buckets.
-- KEYS: the meter key K, a hash {l: the last bucket written (absolute number),
-- <j mod size>: count of bucket j}. commit clears the buckets between the last write
-- and now (the buckets ahead of the last one), HINCRBYs the current bucket and renews
-- the TTL, so a stale lap is never counted.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the current bucket leaves the ring.
A.bucket_ring = {}
function A.bucket_ring.check(key, now, cost, lims)
  local w = lims[1][4]
  local size = 0
  for i = 1, #lims do size = max(size, lims[i][2] / w) end
  local cur = floor(now / w)
  local lv = redis.call('HGET', key, 'l')
  local set, last = false, 0
  if lv then set, last = true, tonumber(lv) end
  if set and last > cur then cur = last end
  local b = {}
  if set then
    local fields, idx = {}, {}
    for j = max(cur - size + 1, last - size + 1), last do
      fields[#fields + 1] = string.format('%d', j % size)
      idx[#idx + 1] = j
    end
    if #fields > 0 then
      local vals = redis.call('HMGET', key, unpack(fields))
      for i = 1, #idx do b[idx[i]] = tonumber(vals[i] or '0') end
    end
  end
  local function bucket(j) return b[j] or 0 end
  local ds, sums, allowed = {}, {}, true
  for i = 1, #lims do
    local span = lims[i][2] / w
    local sum = 0
    for j = cur - span + 1, cur do sum = sum + bucket(j) end
    sums[i] = sum
    local ok = 0
    if sum + cost <= lims[i][1] then ok = 1 else allowed = false end
    ds[i] = {ok, 0, 0, 0, 0}
  end
  local function newest(after)
    for j = cur, cur - size + 1, -1 do
      local c = bucket(j)
      if after and j == cur then c = c + cost end
      if c > 0 then return j end
    end
    return cur - size
  end
  local jz = newest(allowed)
  for i = 1, #lims do
    local n, span, d = lims[i][1], lims[i][2] / w, ds[i]
    if d[ALLOWED] == 1 and allowed then d[REMAINING] = n - sums[i] - cost else d[REMAINING] = max(0, n - sums[i]) end
    if jz > cur - span then d[RESET_US] = (jz + span) * w - now end
    if d[ALLOWED] == 0 then
      if cost > n then
        d[RETRY_US] = lims[i][2]
      else
        local sum = sums[i]
        for k = 1, span do
          sum = sum - bucket(cur - span + k)
          if sum + cost <= n then
            d[RETRY_US] = (cur + k) * w - now
            break
          end
        end
      end
    end
  end
  if not allowed then return ds end
  return ds, function()
    if cost == 0 then return {} end
    if not set or cur - last >= size then
      redis.call('DEL', key)
    elseif cur > last then
      local clear = {}
      for j = last + 1, cur do clear[#clear + 1] = string.format('%d', j % size) end
      redis.call('HDEL', key, unpack(clear))
    end
    redis.call('HINCRBY', key, string.format('%d', cur % size), cost)
    redis.call('HSET', key, 'l', string.format('%d', cur))
    redis.call('PEXPIRE', key, ttl((cur + size) * w - now))
    return {string.format('%d', cur)}
  end, {key}
end
function A.bucket_ring.refund(key, now, cost, lims, extra)
  local w = lims[1][4]
  local size = 0
  for i = 1, #lims do size = max(size, lims[i][2] / w) end
  local cur = tonumber(extra[1])
  local lv = redis.call('HGET', key, 'l')
  if lv and cur > tonumber(lv) - size then
    redis.call('HINCRBY', key, string.format('%d', cur % size), -cost)
  end
end
