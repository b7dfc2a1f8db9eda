-- decide: every meter of one request, all-or-nothing, in one round trip.
-- KEYS[i]: the key of meter i (all in one cluster slot).
-- ARGV: now_us, cost, undo (1: reply with what a refund needs), meter count M, then
--   per meter: algorithm, shadow (0|1), record ('' = none), limit count L, then L
--   times: count, period_us, capacity, bucket_us.
--   now_us is '' for the server's clock (redis.call('TIME')), 'S' and a time for the
--   server's clock as many.lua read it for its batch, or a plain time: the caller's
--   clock, which adds one second to every TTL (see prelude.lua); '' and 'S' add none.
-- Reply: {now_us, allowed (0|1), then per meter per limit: allowed, remaining,
--   reset_after_us, retry_after_us, delay_us}; with undo, then per charged meter:
--   meter index, key count, then per key: name, dump before ('' = absent),
--   pexpiretime before (ms, -2 = absent), dump after ('' = absent); extra count,
--   extra...
--   Without undo every element is a number (never nil or false): the Go side reads
--   the reply as integers, and a nil there would leave the rest of the reply unread.
-- Every meter is checked (read-only) first; only when no non-shadow meter denies are
-- the meters that allow charged. A shadow meter that denies is reported, not charged.
-- fast.lua, the script's first lines, read now (and slack) and decided the common
-- requests (meters of one limit each of its algorithms, nothing recorded, no undo).
ttl_slack = slack
local cost = tonumber(ARGV[2])
local undo = ARGV[3] == '1'
if ARGV[4] == '1' and not undo then
  -- One meter without undo that fast.lua did not take (several limits, a recorded
  -- value, another algorithm): no bookkeeping for several.
  local algo = A[ARGV[5]]
  if not algo then return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[5])) end
  local nl = tonumber(ARGV[8])
  local lims = {}
  for j = 1, nl do
    local p = 9 + (j - 1) * 4
    lims[j] = {tonumber(ARGV[p]), tonumber(ARGV[p + 1]), tonumber(ARGV[p + 2]), tonumber(ARGV[p + 3])}
  end
  local ds, commit = algo.check(KEYS[1], now, cost, lims, ARGV[7])
  local out = {now, 1}
  for j = 1, #ds do
    local d, o = ds[j], 2 + (j - 1) * 5
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5] = d[ALLOWED], d[REMAINING], d[RESET_US], d[RETRY_US], d[DELAY_US]
  end
  if commit then
    commit()
  elseif ARGV[6] ~= '1' then
    out[2] = 0
  end
  return out
end
local m = tonumber(ARGV[4])
local pos = 5
local out = {now, 1}
local commits = {}
local allowed = true
for i = 1, m do
  local algo = A[ARGV[pos]]
  if not algo then return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[pos])) end
  local shadow = ARGV[pos + 1] == '1'
  local record = ARGV[pos + 2]
  local nl = tonumber(ARGV[pos + 3])
  pos = pos + 4
  local lims = {}
  for j = 1, nl do
    lims[j] = {tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])}
    pos = pos + 4
  end
  local ds, commit, writes = algo.check(KEYS[i], now, cost, lims, record)
  for j = 1, #ds do
    local d = ds[j]
    out[#out + 1] = d[ALLOWED]
    out[#out + 1] = d[REMAINING]
    out[#out + 1] = d[RESET_US]
    out[#out + 1] = d[RETRY_US]
    out[#out + 1] = d[DELAY_US]
  end
  if commit then
    commits[#commits + 1] = {i, commit, writes}
  elseif not shadow then
    allowed = false
  end
end
if not allowed then
  out[2] = 0
  return out
end
for c = 1, #commits do
  local i, commit, writes = commits[c][1], commits[c][2], commits[c][3]
  if undo then
    -- Snapshot every key the commit may write before it writes, so that a refund can
    -- restore the bytes exactly when nothing else touched them in between.
    local before, expires = {}, {}
    for k = 1, #writes do
      before[k] = redis.call('DUMP', writes[k]) or ''
      expires[k] = redis.call('PEXPIRETIME', writes[k])
    end
    local extra = commit()
    out[#out + 1] = i - 1 -- the meter's index in the call, from 0
    out[#out + 1] = #writes
    for k = 1, #writes do
      out[#out + 1] = writes[k]
      out[#out + 1] = before[k]
      out[#out + 1] = expires[k]
      out[#out + 1] = redis.call('DUMP', writes[k]) or ''
    end
    out[#out + 1] = #extra
    for k = 1, #extra do out[#out + 1] = extra[k] end
  else
    commit()
  end
end
return out
