-- Shared by the job journal's scripts (gateway/journal.py), prepended to each.
-- Redis' own clock, in milliseconds: every replica's leases are judged by the same clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
