-- abandon: a job whose `create` may have run, its submitter told it did not (the reply was lost,
-- or the client left): whoever claims it cancels it, at once (its lease is handed back), and its
-- idempotency record goes while it names the job, so that the submitter's retry with the key
-- makes a job that runs instead of being handed this one, cancelled.
-- KEYS[1] job hash  KEYS[2] open-jobs index  KEYS[3] its idempotency key's record
-- ARGV[1] index member  ARGV[2] job id
-- Returns 1 | 0 (never journaled, or ended)
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'ended') then return 0 end
redis.call('HSET', KEYS[1], 'cancel', 1)
if redis.call('GET', KEYS[3]) == ARGV[2] then
  redis.call('DEL', KEYS[3])
  redis.call('HDEL', KEYS[1], 'key_record')
end
-- its creator's token: nobody has claimed it yet
if redis.call('HGET', KEYS[1], 'token') == '1' then
  redis.call('HINCRBY', KEYS[1], 'token', 1)
  redis.call('HSET', KEYS[1], 'lease_until', 0)
  redis.call('ZADD', KEYS[2], 0, ARGV[1])
end
return 1
