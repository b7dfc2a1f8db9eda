-- many: several independent requests in one call, each decided as decide.lua decides
-- it (all-or-nothing within the request, never across requests). The Go package wraps
-- the decision script in `local function decide(KEYS, ARGV) ... end` ahead of this
-- file. One call instead of one per request saves Redis the dispatch of each command
-- and the setup of each script call; the requests' keys must all be on this node.
-- KEYS: every request's keys, request after request.
-- ARGV: request count R, then per request: its key count, its ARGV count N, and the N
--   values of decide.lua's ARGV.
-- Reply: R elements, each decide.lua's reply to that request, or an error reply when
--   the request failed (the other requests are unaffected).
local r = tonumber(ARGV[1])
local out = {}
local kp, ap = 1, 2
for i = 1, r do
  local nk, na = tonumber(ARGV[ap]), tonumber(ARGV[ap + 1])
  local keys, args = {}, {}
  for j = 1, nk do keys[j] = KEYS[kp + j - 1] end
  for j = 1, na do args[j] = ARGV[ap + 1 + j] end
  kp, ap = kp + nk, ap + 2 + na
  local ok, rep = pcall(decide, keys, args)
  if ok then
    out[i] = rep
  else
    out[i] = redis.error_reply(tostring(rep))
  end
end
return out
