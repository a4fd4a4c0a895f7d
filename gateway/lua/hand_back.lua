-- hand_back: the owner gives a job up (it is shutting down): any replica may claim it at once,
-- and the old token is fenced off.
-- KEYS[1] job hash  KEYS[2] open-jobs index
-- ARGV[1] token  ARGV[2] index member
-- Returns 1 | 0 (not the owner any more)
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
redis.call('HINCRBY', KEYS[1], 'token', 1)
redis.call('HSET', KEYS[1], 'lease_until', 0)
if not redis.call('HGET', KEYS[1], 'ended') then redis.call('ZADD', KEYS[2], 0, ARGV[2]) end
return 1
