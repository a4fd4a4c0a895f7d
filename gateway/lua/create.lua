-- create: a new job, owned by the replica that admitted it (fencing token 1).
-- KEYS[1] job hash  KEYS[2] open-jobs index  KEYS[3] the idempotency key's record
-- ARGV[1] index member  ARGV[2] replica  ARGV[3] lease ttl ms  ARGV[4] idempotency key given (0/1)
-- ARGV[5] that record's ttl s  ARGV[6..] the submission's field, value pairs
-- Returns {'ok'} | {'exists', job_id}: the idempotency key already names a job
if ARGV[4] == '1' then
  local existing = redis.call('GET', KEYS[3])
  if existing then return {'exists', existing} end
end
local until_ms = now_ms() + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[2], 'token', 1, 'lease_until', until_ms, 'seq', 0,
  unpack(ARGV, 6))
redis.call('ZADD', KEYS[2], until_ms, ARGV[1])
if ARGV[4] == '1' then
  redis.call('SET', KEYS[3], redis.call('HGET', KEYS[1], 'job_id'), 'EX', tonumber(ARGV[5]))
  redis.call('HSET', KEYS[1], 'key_record', KEYS[3])  -- dropped with the job (append.lua)
end
return {'ok'}
