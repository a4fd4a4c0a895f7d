-- Shared by the job journal's scripts (gateway/journal.py), prepended to each.
-- Redis' own clock, in milliseconds: every replica's leases are judged by the same clock.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Fractional numbers leave as '%.17g' strings: Redis truncates Lua numbers it is handed.
local function fmt(x)
  return string.format('%.17g', x)
end
