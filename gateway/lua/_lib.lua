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

-- A field read as an integer, or nil where it is none (gone, or corrupted: `1.5` too, which
-- Redis' increments and stream ids refuse as `x` is refused).
local function integer(x)
  local n = tonumber(x)
  if n and n == math.floor(n) and math.abs(n) < 2 ^ 53 then return n end
  return nil
end

-- A job's last sequence: its hash's `seq`, or where that cannot be read, its log's newest entry
-- (`0-<sequence>`, 0 for none), which `seq` only mirrors: an error here would fail every
-- append of the round trip, every job's events held back with it.
local function last_sequence(job, log)
  local seq = integer(redis.call('HGET', job, 'seq'))
  if seq then return seq end
  local newest = redis.call('XREVRANGE', log, '+', '-', 'COUNT', 1)[1]
  return newest and tonumber(string.match(newest[1], '%-(%d+)$')) or 0
end
