-- append: a batch of a job's events, by its owner only (the fencing token), without a gap or a
-- duplicate: a batch sent again after a lost reply writes only what is not there yet.
-- KEYS[1] job hash  KEYS[2] its event stream  KEYS[3] open-jobs index
-- ARGV[1] token  ARGV[2] first sequence  ARGV[3] index member  ARGV[4] batch ends the job (0/1)
-- ARGV[5] retention s of an ended job  ARGV[6..] the events, encoded
-- Returns {'ok'} | {'fenced'}: another replica owns the job | {'gap', last sequence}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return {'fenced'} end
local last = tonumber(redis.call('HGET', KEYS[1], 'seq'))
local first = tonumber(ARGV[2])
if first > last + 1 then return {'gap', last} end
for i = 6, #ARGV do
  local seq = first + i - 6
  if seq > last then redis.call('XADD', KEYS[2], '0-' .. seq, 'e', ARGV[i]) end
end
redis.call('HSET', KEYS[1], 'seq', math.max(last, first + #ARGV - 6))
if ARGV[4] == '1' then
  redis.call('HSET', KEYS[1], 'ended', 1)
  redis.call('ZREM', KEYS[3], ARGV[3])
  redis.call('EXPIRE', KEYS[1], tonumber(ARGV[5]))
  redis.call('EXPIRE', KEYS[2], tonumber(ARGV[5]))
end
return {'ok'}
