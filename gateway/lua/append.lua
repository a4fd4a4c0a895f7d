-- append: a batch of a job's events, by its owner only (the fencing token), without a gap or a
-- duplicate: a batch sent again after a lost reply writes only what is not there yet. The batch
-- that ends the job gives its idempotency record the job's retention, and keeps its tenant's
-- ended jobs within their bounds: each is noted with its size in Redis' memory, and the oldest
-- beyond `max count` or `max bytes` are dropped with their idempotency record (never the one
-- ending now); notes of jobs expired since are removed.
-- KEYS[1] job hash  KEYS[2] its event stream  KEYS[3] open-jobs index
-- KEYS[4] the tenant's ended jobs (a sorted set by end)  KEYS[5] their sizes (a hash, `total`)
-- ARGV[1] token  ARGV[2] first sequence  ARGV[3] index member  ARGV[4] batch ends the job (0/1)
-- ARGV[5] retention s of an ended job  ARGV[6] max count  ARGV[7] max bytes
-- ARGV[8] the prefix of a job's keys (before its member)
-- ARGV[9] the job's snapshot as of the batch's last event, or '' for none  ARGV[10..] the events
-- Returns {'ok'} | {'fenced'}: another replica owns the job | {'gap', last sequence}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {'fenced'} end
local last = last_sequence(KEYS[1], KEYS[2])
local first = tonumber(ARGV[2])
if first > last + 1 then return {'gap', last} end
for i = 10, #ARGV do
  local seq = first + i - 10
  if seq > last then redis.call('XADD', KEYS[2], '0-' .. seq, 'e', ARGV[i]) end
end
redis.call('HSET', KEYS[1], 'seq', math.max(last, first + #ARGV - 10))
if ARGV[9] ~= '' then redis.call('HSET', KEYS[1], 'snapshot', ARGV[9]) end
-- the ending batch sent again (its reply was lost) must not note the job twice
if ARGV[4] ~= '1' or redis.call('HGET', KEYS[1], 'ended') then return {'ok'} end

local retention_s = tonumber(ARGV[5])
redis.call('HSET', KEYS[1], 'ended', 1)
redis.call('ZREM', KEYS[3], ARGV[3])
redis.call('EXPIRE', KEYS[1], retention_s)
redis.call('EXPIRE', KEYS[2], retention_s)
-- its idempotency record names it as long as it is kept, and no longer: a key naming a job gone
-- would answer a submission with it NOT_FOUND until the record's own day ran out
local record = redis.call('HGET', KEYS[1], 'key_record')
if record and redis.call('GET', record) == redis.call('HGET', KEYS[1], 'job_id') then
  redis.call('EXPIRE', record, retention_s)
end

-- the sizes' `total` only sums its members': where it cannot be read it is summed again, and a
-- member that cannot be read counts as nothing (either failed this script, and with it the
-- round trip that writes every job's events)
if not integer(redis.call('HGET', KEYS[5], 'total')) then
  local sum, fields = 0, redis.call('HGETALL', KEYS[5])
  for i = 1, #fields, 2 do
    if fields[i] ~= 'total' then sum = sum + (integer(fields[i + 1]) or 0) end
  end
  redis.call('HSET', KEYS[5], 'total', sum)
end

local function forget(member)
  local size = integer(redis.call('HGET', KEYS[5], member)) or 0
  redis.call('HDEL', KEYS[5], member)
  return redis.call('HINCRBY', KEYS[5], 'total', 0 - size)  -- not -size: -0 is no integer to Redis
end

local now = now_ms()
local expired = now - retention_s * 1000
for _, member in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', expired)) do
  forget(member)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', expired)
-- end order, even for jobs ending in the same millisecond
local newest = redis.call('ZREVRANGE', KEYS[4], 0, 0, 'WITHSCORES')
local score = now
if newest[2] then score = math.max(now, tonumber(newest[2]) + 1) end
-- every field and entry counted (SAMPLES 0): by default a few are sampled and scaled, and a
-- job's hash is a dozen small fields and one large spec
local size = (redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', '0') or 0)
  + (redis.call('MEMORY', 'USAGE', KEYS[2], 'SAMPLES', '0') or 0)
redis.call('ZADD', KEYS[4], score, ARGV[3])
redis.call('HSET', KEYS[5], ARGV[3], size)
local total = redis.call('HINCRBY', KEYS[5], 'total', size)
local max_count, max_bytes = tonumber(ARGV[6]), tonumber(ARGV[7])
local count = redis.call('ZCARD', KEYS[4])
while count > 1 and (count > max_count or total > max_bytes) do
  local oldest = redis.call('ZPOPMIN', KEYS[4])[1]
  total = forget(oldest)
  count = count - 1
  local job = ARGV[8] .. oldest
  local record = redis.call('HGET', job, 'key_record')
  if record and redis.call('GET', record) == redis.call('HGET', job, 'job_id') then
    redis.call('DEL', record)
  end
  redis.call('DEL', job, job .. ':log')
end
redis.call('EXPIRE', KEYS[4], retention_s)
redis.call('EXPIRE', KEYS[5], retention_s)
return {'ok'}
