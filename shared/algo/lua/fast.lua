-- fast: the decision script's first lines. They read the time and decide the common
-- request -- meters of one limit each, no undo, nothing recorded, no calendar -- of the algorithms
-- below in flat code, before the rest of the script defines a single function: Redis
-- runs the whole script body on every call, and creating the closures and tables of
-- the general path costs more than the decision itself.
-- Every meter is checked first; a request of one meter writes as it decides, one of
-- several keeps its writes until no non-shadow meter denies, as decide.lua does.
-- Each block is the same arithmetic as its algorithm's check and commit (the
-- conformance tests run both paths against the Go models); the helpers of prelude.lua
-- are written out: ceil_us(x) is max(0, ceil(x)), ttl(us) is max(1, ceil((us + slack) /
-- 1000)), num(x) is '%d' for a whole x, else '%.17g'.
-- ARGV and reply: see decide.lua.
local now, slack
if ARGV[1] == '' then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  slack = 0
elseif string.byte(ARGV[1]) == 83 then
  -- 'S' and the server's time, which many.lua read once for a whole batch
  now = tonumber(string.sub(ARGV[1], 2))
  slack = 0
else
  now = tonumber(ARGV[1])
  slack = 1000000
end
local nm = tonumber(ARGV[4])
local flat = ARGV[3] ~= '1'
if flat then
  for i = 1, nm do
    local pos = 1 + i * 8 -- a meter of one limit has 8 values, the first at 5
    local alg = ARGV[pos - 4]
    if ARGV[pos - 2] ~= '' or ARGV[pos - 1] ~= '1' or ARGV[pos + 3] ~= '0' or not (alg == 'gcra' or
        alg == 'leaky_bucket' or alg == 'fixed_window' or alg == 'token_bucket' or alg == 'sliding_window') then
      flat = false
      break
    end
  end
end
if flat then
  local cost = tonumber(ARGV[2])
  local mfloor, mceil, mmax = math.floor, math.ceil, math.max
  local out = {now, 1}
  local pend -- with several meters: the writes, run once no meter denies
  if nm > 1 then pend = {} end
  for i = 1, nm do
    local pos = 1 + i * 8
    local alg, key = ARGV[pos - 4], KEYS[i]
    local n, p, b = tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2])
    local ok, rem, reset, retry, delay = 0, 0, 0, 0, 0
    if alg == 'gcra' or alg == 'leaky_bucket' then
      -- gcra_core and gcra_write (tat_slack is 1, ceil_tat(x) is ceil_us(x - 0.25))
      local t = p / n
      local rel = 0
      local v = redis.call('GET', key)
      if v then rel = mmax(0, tonumber(v) - now) end
      local new_rel = rel + cost * t
      local burst = b * t
      if new_rel > burst + 1 then
        retry = p
        if cost <= b then retry = mmax(0, mceil(new_rel - burst - 0.25)) end
        rem, reset = mmax(0, mfloor((burst - rel + 1) / t)), mmax(0, mceil(rel - 0.25))
      else
        ok = 1
        rem, reset = mmax(0, mfloor((burst - new_rel + 1) / t)), mmax(0, mceil(new_rel - 0.25))
        if alg == 'leaky_bucket' then delay = mmax(0, mceil(rel - 0.25)) end
        if cost > 0 then
          local tat = now + new_rel
          if tat == mfloor(tat) then tat = string.format('%d', tat) else tat = string.format('%.17g', tat) end
          local ms = mmax(1, mceil((reset + slack) / 1000))
          if pend then pend[#pend + 1] = {'SET', key, tat, 'PX', ms} else redis.call('SET', key, tat, 'PX', ms) end
        end
      end
    elseif alg == 'fixed_window' then
      -- A.fixed_window.check and its commit; SET ... PX leaves what INCRBY and
      -- PEXPIRE leave, in one command
      local w = mfloor(now / p)
      local k = key .. ':' .. string.format('%d', w)
      local used = tonumber(redis.call('GET', k) or '0')
      local e = (w + 1) * p
      reset = e - now
      if used + cost > n then
        rem, retry = mmax(0, n - used), e - now
        if cost > n then retry = p end
        if used == 0 then reset = 0 end
      else
        ok, rem = 1, n - used - cost
        if used + cost == 0 then reset = 0 end
        if cost > 0 then
          local v, ms = string.format('%d', used + cost), mmax(1, mceil((e - now + slack) / 1000))
          if pend then pend[#pend + 1] = {'SET', k, v, 'PX', ms} else redis.call('SET', k, v, 'PX', ms) end
        end
      end
    elseif alg == 'token_bucket' then
      -- A.token_bucket.check and its commit
      local st = redis.call('HMGET', key, 't', 's')
      local tokens, last = b, now
      if st[1] then tokens, last = tonumber(st[1]), tonumber(st[2]) end
      local ahead = mmax(0, last - now)
      local avail = math.min(b, tokens + mmax(0, now - last) * n / p)
      if avail < cost then
        rem = mfloor(avail)
        if cost > b then retry = p else retry = mmax(0, mceil(ahead + (cost - avail) * p / n)) end
        reset = mmax(0, mceil(ahead + (b - avail) * p / n))
      else
        local left = avail - cost
        ok, rem, reset = 1, mfloor(left), mmax(0, mceil(ahead + (b - left) * p / n))
        if cost > 0 then
          local s = mmax(now, last)
          if left == mfloor(left) then left = string.format('%d', left) else left = string.format('%.17g', left) end
          if s == mfloor(s) then s = string.format('%d', s) else s = string.format('%.17g', s) end
          local ms = mmax(1, mceil((reset + slack) / 1000))
          if pend then
            pend[#pend + 1] = {'HSET', key, 't', left, 's', s}
            pend[#pend + 1] = {'PEXPIRE', key, ms}
          else
            redis.call('HSET', key, 't', left, 's', s)
            redis.call('PEXPIRE', key, ms)
          end
        end
      end
    elseif alg == 'sliding_window' then
      -- A.sliding_window.check (sw_reset inlined) and its commit
      local w = mfloor(now / p)
      local st = redis.call('HMGET', key, 'w', 'c', 'p')
      local shift, at = 0, now
      if st[1] and tonumber(st[1]) > w then
        w = tonumber(st[1])
        shift = w * p - now
        at = w * p
      end
      local e = at - w * p
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
        rem = mmax(0, mfloor(n - est))
        if cost > n then
          retry = p
        elseif cur + cost <= n then
          retry = mmax(1, mceil(p - (n - cur - cost) * p / prev) - e)
        else
          local t = 0
          if cur > 0 then t = mmax(0, mceil(p - (n - cost) * p / cur)) end
          retry = (w + 1) * p - at + t
        end
        if cur > 0 then reset = (w + 2) * p - at elseif prev > 0 then reset = (w + 1) * p - at end
        if reset > 0 then reset = reset + shift end
        if retry > 0 and cost <= n then retry = retry + shift end
      else
        ok, rem = 1, mfloor(n - est - cost)
        if cur + cost > 0 then reset = (w + 2) * p - at elseif prev > 0 then reset = (w + 1) * p - at end
        if reset > 0 then reset = reset + shift end
        if cost > 0 then
          local ws, ms = string.format('%d', w), mmax(1, mceil(((w + 2) * p - at + slack) / 1000))
          if pend then
            pend[#pend + 1] = {'HSET', key, 'w', ws, 'c', cur + cost, 'p', prev}
            pend[#pend + 1] = {'PEXPIRE', key, ms}
          else
            redis.call('HSET', key, 'w', ws, 'c', cur + cost, 'p', prev)
            redis.call('PEXPIRE', key, ms)
          end
        end
      end
    end
    local o = i * 5 - 2 -- the meter's decision, after now and the outcome
    out[o], out[o + 1], out[o + 2], out[o + 3], out[o + 4] = ok, rem, reset, retry, delay
    -- a shadow meter that denies is reported, and blocks nothing
    if ok == 0 and ARGV[pos - 3] ~= '1' then out[2] = 0 end
  end
  if pend and out[2] == 1 then
    for j = 1, #pend do redis.call(unpack(pend[j])) end
  end
  return out
end
