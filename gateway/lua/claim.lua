-- claim: take over a job whose owner's lease has run out (or was handed back); a new fencing
-- token fences the old owner's late writes off.
-- KEYS[1] job hash  KEYS[2] open-jobs index
-- ARGV[1] replica  ARGV[2] lease ttl ms  ARGV[3] index member  ARGV[4] this claim's nonce
-- Returns the new token | false: ended, gone, or its lease still runs (unless this very claim
-- took it: sent again after its reply was lost, it gets the token it took)
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'ended') then
  redis.call('ZREM', KEYS[2], ARGV[3])
  return false
end
local now = now_ms()
-- an unreadable lease counts as lapsed (the new token fences off whoever held it): an error here
-- would come before the index moves the job, so every scan would stop at it again
if (tonumber(redis.call('HGET', KEYS[1], 'lease_until')) or 0) > now then
  if redis.call('HGET', KEYS[1], 'claim') ~= ARGV[4] then return false end
  return integer(redis.call('HGET', KEYS[1], 'token'))
end
-- an unreadable token (the increment would fail, and every scan stop here) becomes one no holder
-- can have: tokens count claims from 1, and Redis' clock in ms is far past any such count
if not integer(redis.call('HGET', KEYS[1], 'token')) then
  redis.call('HSET', KEYS[1], 'token', now)
end
local token = redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'lease_until', now + tonumber(ARGV[2]),
  'claim', ARGV[4])
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[3])
return token
