-- renew: the owner extends its lease on a job; it also learns of a cancel asked elsewhere.
-- KEYS[1] job hash  KEYS[2] open-jobs index
-- ARGV[1] token  ARGV[2] lease ttl ms  ARGV[3] index member
-- Returns {'ok', cancel asked (0/1)} | {'lost'}: another replica owns it (or it is gone)
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] or redis.call('HGET', KEYS[1], 'ended') then
  return {'lost'}
end
local until_ms = now_ms() + tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'lease_until', until_ms)
redis.call('ZADD', KEYS[2], until_ms, ARGV[3])
return {'ok', redis.call('HGET', KEYS[1], 'cancel') or '0'}
