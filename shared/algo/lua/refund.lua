-- refund: undo the charge of a decide call whose request a later cluster slot denied.
-- KEYS: per meter, its key then the keys its commit wrote (all in one cluster slot).
-- ARGV: charged_now_us, refund_now_us ('' = the server's clock), cost, meter count M,
--   then per meter: algorithm, record,
--   limit count L, L times {count, period_us, capacity, bucket_us}, key count K,
--   K times {dump before ('' = absent), pexpiretime before (ms, -2 = absent),
--   dump after ('' = absent)}, extra count E, E extra values (from decide's undo).
-- For each meter: when every key it wrote still holds exactly the bytes the charge
-- left, the keys are restored byte for byte (RESTORE ... ABSTTL, or DEL where the key
-- was absent); when anything else wrote them since, the algorithm's own inverse gives
-- the units back instead, so a refund never loses another request's charge.
-- Reply: the number of meters restored byte for byte.
local now = tonumber(ARGV[1])
local refund_now
if ARGV[2] ~= '' then
  refund_now = tonumber(ARGV[2])
else
  local t = redis.call('TIME')
  refund_now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local cost = tonumber(ARGV[3])
local m = tonumber(ARGV[4])
local pos, kpos, exact = 5, 1, 0
for i = 1, m do
  local algo = A[ARGV[pos]]
  if not algo then return redis.error_reply('tollgate: unknown algorithm ' .. tostring(ARGV[pos])) end
  local record = ARGV[pos + 1]
  local nl = tonumber(ARGV[pos + 2])
  pos = pos + 3
  local lims = {}
  for j = 1, nl do
    lims[j] = {tonumber(ARGV[pos]), tonumber(ARGV[pos + 1]), tonumber(ARGV[pos + 2]), tonumber(ARGV[pos + 3])}
    pos = pos + 4
  end
  local key = KEYS[kpos]
  local nk = tonumber(ARGV[pos])
  pos = pos + 1
  local same = true
  for k = 1, nk do
    local after = ARGV[pos + (k - 1) * 3 + 2]
    local cur = redis.call('DUMP', KEYS[kpos + k]) or ''
    if cur ~= after then same = false end
  end
  local ne = tonumber(ARGV[pos + nk * 3])
  local extra = {}
  for e = 1, ne do extra[e] = ARGV[pos + nk * 3 + e] end
  if same then
    for k = 1, nk do
      local name = KEYS[kpos + k]
      local before, exp = ARGV[pos + (k - 1) * 3], tonumber(ARGV[pos + (k - 1) * 3 + 1])
      if before == '' then
        redis.call('DEL', name)
      elseif exp > 0 then
        redis.call('RESTORE', name, exp, before, 'REPLACE', 'ABSTTL')
      else
        redis.call('RESTORE', name, 0, before, 'REPLACE')
      end
    end
    exact = exact + 1
  else
    algo.refund(key, now, cost, lims, extra, record, refund_now)
  end
  pos = pos + nk * 3 + 1 + ne
  kpos = kpos + 1 + nk
end
return exact
