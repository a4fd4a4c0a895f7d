-- reserve.lua: hold `tokens` for one call against max_concurrent_calls, the daily budget and
-- the token bucket, in that order; a call id already open is returned as it is, uncharged.
-- KEYS[1..8], ARGV[1]: as in _lib.lua.  ARGV[2] call_id  ARGV[3] tokens  ARGV[4] ttl_s
-- Returns {'ok', expires_at} | {'open', tokens, expires_at} | {'closed'} | {'no_tenant'}
--   | {'calls', limit, active} | {'budget', budget, used, now} | {'rate', rate, level}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
reclaim(now)
local call_id, tokens, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local held = redis.call('HGET', KEYS[4], call_id)
if held then
  return {'open', parse_open(held), redis.call('ZSCORE', KEYS[5], call_id)}
end
if redis.call('ZSCORE', KEYS[6], call_id) then return {'closed'} end
local limit, active = quota_int('max_concurrent_calls'), redis.call('HLEN', KEYS[4])
if limit > 0 and active >= limit then return {'calls', limit, active} end
local today = math.floor(now / DAY_S)
local budget, used = quota_int('daily_token_budget'), used_on(today)
if budget > 0 and used + tokens > budget then return {'budget', budget, used, fmt(now)} end
local rate = quota_int('tokens_per_minute')
local level = bucket_level(now, rate)
if level and level < tokens then return {'rate', rate, fmt(level)} end
bucket_add(now, rate, -tokens)
day_add(today, tokens)
redis.call('HSET', KEYS[4], call_id, tokens .. ' ' .. today)
redis.call('ZADD', KEYS[5], fmt(now + ttl), call_id)
return {'ok', fmt(now + ttl)}
