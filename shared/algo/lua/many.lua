-- many: several independent requests in one call, each decided as decide.lua decides
-- it (all-or-nothing within the request, never across requests). The Go package wraps
-- the decision script in `local function decide(KEYS, ARGV) ... end` ahead of this
-- file. One call instead of one per request saves Redis the dispatch of each command
-- and the setup of each script call; the requests' keys must all be on this node.
-- KEYS: every request's keys, request after request.
-- ARGV: request count R, profile count P, then P profiles, each its value count N and
--   N values: decide.lua's ARGV from the third on (undo, meter count, meters), shared
--   by the requests that name it; then per request: its key count, its profile (from
--   1), and decide.lua's ARGV[1] (now, '' = the server's clock) and ARGV[2] (cost).
--   The Go side gives requests of the same cached meter (one limit, nothing recorded)
--   one profile, so a batch sends those limits once; other requests get their own.
-- Time: the server's clock is read once for the whole batch (every request in it is
--   decided at that instant) and handed to decide.lua as 'S' and the time.
-- Reply: R elements, each decide.lua's reply to that request, or an error reply when
--   the request failed (the other requests are unaffected).
local r, np = tonumber(ARGV[1]), tonumber(ARGV[2])
local profiles = {}
local ap = 3
for i = 1, np do
  local n = tonumber(ARGV[ap])
  local args = {'', ''}
  for j = 1, n do args[j + 2] = ARGV[ap + j] end
  profiles[i] = args
  ap = ap + 1 + n
end
local server
local out = {}
local kp = 1
for i = 1, r do
  local nk, args = tonumber(ARGV[ap]), profiles[tonumber(ARGV[ap + 1])]
  local keys = {}
  for j = 1, nk do keys[j] = KEYS[kp + j - 1] end
  local now = ARGV[ap + 2]
  if now == '' then
    if not server then
      local t = redis.call('TIME')
      server = 'S' .. string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
    end
    now = server
  end
  kp, ap = kp + nk, ap + 4
  local ok, rep
  if args then
    -- decide only reads its ARGV: the profile's table serves every request naming it
    args[1], args[2] = now, ARGV[ap - 1]
    ok, rep = pcall(decide, keys, args)
  else
    ok, rep = false, 'tollgate: no profile ' .. tostring(ARGV[ap - 3])
  end
  if ok then
    out[i] = rep
  else
    out[i] = redis.error_reply(tostring(rep))
  end
end
return out
