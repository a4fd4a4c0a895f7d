-- renew.lua: renew the leases of running work in one step: each named open reservation and each
-- named admitted job expires at now + ttl_s instead. Expired ones are reclaimed first, so a lease
-- that ran out stays lost; nothing is opened, admitted or charged.
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] ttl_s  ARGV[3] n, the number of call ids
-- ARGV[4 .. 3+n] call ids  ARGV[4+n ..] job ids
-- Returns the named call ids that are not open (reclaimed, closed or unknown), in ARGV order.
local now = clock()
local n = tonumber(ARGV[3])
local lost = {}
if redis.call('EXISTS', KEYS[1]) == 0 then
  for i = 4, 3 + n do table.insert(lost, ARGV[i]) end
  return lost
end
reclaim(now)
prune_jobs(now)
local expires_at = fmt(now + tonumber(ARGV[2]))
for i = 4, 3 + n do
  if redis.call('HEXISTS', KEYS[4], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[5], expires_at, ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
for i = 4 + n, #ARGV do
  redis.call('ZADD', KEYS[8], 'XX', expires_at, ARGV[i])
end
return lost
