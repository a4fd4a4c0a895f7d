-- usage.lua: reclaim what has expired, then read the tenant's usage.
-- KEYS[1..9], ARGV[1]: as in _lib.lua.
-- Returns {'no_tenant'} | {'ok', input_tokens, output_tokens, settled_calls, tokens_today,
--   active_reservations, reserved_tokens, queued_jobs, bucket_level ('' when unlimited), now}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
reclaim(now)
prune_jobs(now)
local reserved = 0
for _, held in ipairs(redis.call('HVALS', KEYS[4])) do
  reserved = reserved + parse_open(held)
end
local u = redis.call('HMGET', KEYS[7], 'input_tokens', 'output_tokens', 'settled_calls')
local level = bucket_level(now, quota_int('tokens_per_minute'))
return {
  'ok', tonumber(u[1] or '0'), tonumber(u[2] or '0'), tonumber(u[3] or '0'),
  used_on(math.floor(now / DAY_S)), redis.call('HLEN', KEYS[4]), reserved,
  redis.call('ZCARD', KEYS[8]), level and fmt(level) or '', fmt(now),
}
