-- bucket_ring: buckets of width W on a ring of size = longest period / W, in one hash;
-- every window of the meter (a multiple of W) is the sum of its last period/W buckets.
-- KEYS: the meter key K, a hash {l: the last bucket written (absolute number),
-- <j mod size>: count of bucket j}. commit clears the buckets between the last write
-- and now (the buckets ahead of the last one), writes the current bucket's new count and renews
-- the TTL, so a stale lap is never counted.
-- Limits (see prelude.lua): one group per window: count, period_us, capacity (= count),
-- W (the same in every group).
-- Reply: one decision per window; a refund's extra data is the bucket charged.
-- Time: the caller's now (server TIME unless the caller passed one).
-- TTL: until the current bucket leaves the ring.

-- br_ring returns the bucket width and the ring's size in buckets.
local function br_ring(lim)
  local w = lim[4]
  local size = 0
  for i = 0, lim.nl - 1 do size = max(size, lim[4 * i + 2] / w) end
  return w, size
end

-- br_field returns the field name of ring slot i (0 <= i < size), i as text. The
-- names of the first 4096 slots (a ring has at most algo.MaxRingBuckets, 3600) are
-- kept once made: a call names every bucket it reads or clears, and formatting each
-- anew was a tenth of a hot ring's call (BenchmarkScriptCost, tollgate-bucket_ring).
local br_names = {}
local function br_field(i)
  local f = br_names[i]
  if f then return f end
  f = string.format('%d', i)
  if i < 4096 then br_names[i] = f end
  return f
end

A.bucket_ring = algorithm({
  check = function(key, now, cost, lim, record, out, o)
    local w, size = br_ring(lim)
    local cur = floor(now / w)
    local lv = redis.call('HGET', key, 'l')
    local set, last = false, 0
    if lv then set, last = true, tonumber(lv) end
    if set and last > cur then cur = last end
    local b = {}
    if set then
      local fields, idx = {}, {}
      for j = max(cur - size + 1, last - size + 1), last do
        fields[#fields + 1] = br_field(j % size)
        idx[#idx + 1] = j
      end
      if #fields > 0 then
        local vals = redis.call('HMGET', key, unpack(fields))
        for i = 1, #idx do b[idx[i]] = tonumber(vals[i] or '0') end
      end
    end
    local function bucket(j) return b[j] or 0 end
    local sums, allowed = {}, true
    for i = 1, lim.nl do
      local n, span = lim[4 * i - 3], lim[4 * i - 2] / w
      local sum = 0
      for j = cur - span + 1, cur do sum = sum + bucket(j) end
      sums[i] = sum
      if sum + cost > n then allowed = false end
    end
    -- the newest bucket that holds units (after the charge, when it is admitted)
    local jz = cur - size
    for j = cur, cur - size + 1, -1 do
      local c = bucket(j)
      if allowed and j == cur then c = c + cost end
      if c > 0 then
        jz = j
        break
      end
    end
    for i = 1, lim.nl do
      local n, p = lim[4 * i - 3], lim[4 * i - 2]
      local span, sum = p / w, sums[i]
      local ok, remaining, reset, retry = 0, max(0, n - sum), 0, 0
      if sum + cost <= n then
        ok = 1
        if allowed then remaining = n - sum - cost end
      end
      if jz > cur - span then reset = (jz + span) * w - now end
      if ok == 0 then
        if cost > n then
          retry = p
        else
          for k = 1, span do
            sum = sum - bucket(cur - span + k)
            if sum + cost <= n then
              retry = (cur + k) * w - now
              break
            end
          end
        end
      end
      put(out, o + 5 * (i - 1), ok, remaining, reset, retry, 0)
    end
    -- what the current bucket holds before the charge: nothing after a clear
    local here = 0
    if set and cur == last then here = bucket(cur) end
    return allowed, set, last, cur, here
  end,
  commit = function(key, now, cost, lim, record, set, last, cur, here)
    if cost == 0 then return {} end
    local w, size = br_ring(lim)
    if not set or cur - last >= size then
      redis.call('DEL', key)
    elseif cur > last then
      local clear = {}
      for j = last + 1, cur do clear[#clear + 1] = br_field(j % size) end
      redis.call('HDEL', key, unpack(clear))
    end
    -- the bucket and the last bucket written, in one command (the bucket's count was
    -- read in this same call: BenchmarkScriptCost, tollgate-bucket_ring)
    redis.call('HSET', key, br_field(cur % size), string.format('%d', here + cost), 'l', string.format('%d', cur))
    redis.call('PEXPIRE', key, ttl((cur + size) * w - now))
    return {string.format('%d', cur)}
  end,
  refund = function(key, now, cost, lim, extra)
    local _, size = br_ring(lim)
    local cur = tonumber(extra[1])
    local lv = redis.call('HGET', key, 'l')
    if lv and cur > tonumber(lv) - size then
      redis.call('HINCRBY', key, br_field(cur % size), -cost)
    end
  end,
})
