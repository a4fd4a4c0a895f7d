-- _lib.lua: shared functions, prepended to every script of tenants/lua/ when it is loaded.
-- The per-tenant quota scripts (reserve, settle, release, renew, usage, admit_job,
-- admit_and_reserve) take the same KEYS, all in the tenant's hash slot `{tenant}`, and the same
-- ARGV[1]:
--   KEYS[1] tenant     hash  display_name, created_at and the TenantQuota fields
--   KEYS[2] bucket     hash  level, ts: the token bucket's level as of unix time ts
--   KEYS[3] day        hash  day, used: tokens charged to the budget of UTC day number `day`
--   KEYS[4] open       hash  call id -> "<tokens> <day>" for each open reservation
--   KEYS[5] expiry     zset  open call ids scored by expires_at
--   KEYS[6] closed     zset  closed call ids scored by when they may be forgotten
--   KEYS[7] usage      hash  input_tokens, output_tokens, settled_calls
--   KEYS[8] jobs       zset  admitted, unfinished job ids scored by expiry
--   KEYS[9] reclaimed  zset  the closed ids that expiry closed and no settle has charged yet,
--                            scored as in closed: a late settle still charges their use
--   ARGV[1] closed_memory_s: how long a closed call id is remembered
-- Time is Redis TIME. Fractional numbers leave as '%.17g' strings: Redis truncates Lua numbers.

local DAY_S = 86400
-- how long a change's reply is kept under its nonce (`replied`)
local REPLY_KEPT_MS = 60000

local function fmt(x)
  return string.format('%.17g', x)
end

local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1000000
end

local function quota_int(name)
  return tonumber(redis.call('HGET', KEYS[1], name) or '0')
end

-- The bucket level at `now`, refilled and capped at capacity; nil when the rate is unlimited.
local function bucket_level(now, rate)
  if rate <= 0 then return nil end
  local b = redis.call('HMGET', KEYS[2], 'level', 'ts')
  if not b[1] then return rate end
  return math.min(rate, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate / 60)
end

-- A refund never lifts the stored level past capacity: read at a later, higher rate, the excess
-- would be a burst the tenant never had.
local function bucket_add(now, rate, delta)
  local level = bucket_level(now, rate)
  if level then
    redis.call('HSET', KEYS[2], 'level', fmt(math.min(rate, level + delta)), 'ts', fmt(now))
  end
end

local function used_on(day)
  local d = redis.call('HMGET', KEYS[3], 'day', 'used')
  if tonumber(d[1]) ~= day then return 0 end
  return tonumber(d[2])
end

local function day_add(day, delta)
  redis.call('HSET', KEYS[3], 'day', day, 'used', used_on(day) + delta)
end

local function parse_open(held)
  local tokens, day = string.match(held, '^(%d+) (%d+)$')
  return tonumber(tokens), tonumber(day)
end

-- Marks the call id closed and takes its reservation off the open set; the record or false.
local function close(now, call_id)
  redis.call('ZADD', KEYS[6], 'NX', fmt(now + tonumber(ARGV[1])), call_id)
  local held = redis.call('HGET', KEYS[4], call_id)
  if held then
    redis.call('HDEL', KEYS[4], call_id)
    redis.call('ZREM', KEYS[5], call_id)
  end
  return held
end

-- Gives `amount` tokens back to the bucket, and to the budget if it was charged today.
local function refund(now, day, amount)
  bucket_add(now, quota_int('tokens_per_minute'), amount)
  if day == math.floor(now / DAY_S) then day_add(day, -amount) end
end

-- Releases expired reservations (full refund) and marks them reclaimed; forgets closed and
-- reclaimed ids past their memory.
local function reclaim(now)
  local forget_at = fmt(now + tonumber(ARGV[1]))
  for _, call_id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', fmt(now))) do
    local tokens, day = parse_open(close(now, call_id))
    refund(now, day, tokens)
    redis.call('ZADD', KEYS[9], forget_at, call_id)
  end
  redis.call('ZREMRANGEBYSCORE', KEYS[6], '-inf', fmt(now))
  redis.call('ZREMRANGEBYSCORE', KEYS[9], '-inf', fmt(now))
end

-- Drops admitted jobs past their expiry.
local function prune_jobs(now)
  redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', fmt(now))
end

-- Counts a job against max_queued_jobs until finished or expired, after checking
-- max_nodes_per_job; a job id already queued is left as it is.
-- Returns {'ok'} | {'queued'} | {'nodes', limit} | {'jobs', limit, queued}
local function admit(now, job_id, num_nodes, ttl)
  prune_jobs(now)
  if redis.call('ZSCORE', KEYS[8], job_id) then return {'queued'} end
  local max_nodes = quota_int('max_nodes_per_job')
  if max_nodes > 0 and num_nodes > max_nodes then return {'nodes', max_nodes} end
  local max_jobs, queued = quota_int('max_queued_jobs'), redis.call('ZCARD', KEYS[8])
  if max_jobs > 0 and queued >= max_jobs then return {'jobs', max_jobs, queued} end
  redis.call('ZADD', KEYS[8], fmt(now + ttl), job_id)
  return {'ok'}
end

-- Holds `tokens` for one call against max_concurrent_calls, the daily budget and the token
-- bucket, in that order; a call id already open is returned as it is, uncharged.
-- Returns {'ok', expires_at} | {'open', tokens, expires_at} | {'closed'}
--   | {'calls', limit, active} | {'budget', budget, used, now} | {'rate', rate, level}
local function reserve(now, call_id, tokens, ttl)
  reclaim(now)
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
  -- whole digits: `..` writes a number of 15 digits or more as 1e+14, which `parse_open` misreads
  redis.call('HSET', KEYS[4], call_id, string.format('%d %d', tokens, today))
  redis.call('ZADD', KEYS[5], fmt(now + ttl), call_id)
  return {'ok', fmt(now + ttl)}
end

-- The reply a change sent before under this nonce key made, or nil. The client sends a script
-- once more when its connection drops: one that ran, its reply lost, is answered as it ran
-- rather than by what it changed (a tenant it created "already exists").
local function replied(key)
  return redis.call('GET', key)
end

local function keep_reply(key, reply)
  redis.call('SET', key, reply, 'PX', REPLY_KEPT_MS)
  return reply
end
