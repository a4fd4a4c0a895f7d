-- share: one pool's fair share across every replica (gateway/share.py). A replica publishes the
-- tenants it has work for, pays what its ended calls owe, and may ask for one call's grant.
-- KEYS[1] counters  hash  tenant -> service per unit of weight (KV token-time / weight);
--                         '~mean': the moving mean of a grant's charge (tenant ids never hold '~')
-- KEYS[2] active    zset  '<tenant> <replica>' -> when it lapses (ms): work ready, taken or running
-- KEYS[3] waiting   zset  '<tenant> <replica>' -> when it lapses (ms): a ready call it could send
-- ARGV[1] replica id  ARGV[2] entry ttl ms  ARGV[3] slack, in mean charges
-- ARGV[4] tenant asking for a grant ('': none)  ARGV[5] its charge (cost / weight)
-- ARGV[6] a: count of active tenants, then a tenant ids; then w: count of waiting ones, then w
-- ids; then pairs of tenant id, what it owes (charge per unit of weight; negative: a refund)
-- Returns {1}: granted (charged) | {0, lead}: the tenant leads the least-served other waiting
-- tenant by more than the slack | {2}: nothing asked
local counters, active, waiting, me = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local now = now_ms()
local until_ms = now + tonumber(ARGV[2])
local MEAN_RATE = 0.05

local function counter(t)
  return tonumber(redis.call('HGET', counters, t) or '0')
end

-- what ended calls used beyond (or short of) their grants
local a = tonumber(ARGV[6])
local w = tonumber(ARGV[7 + a])
local i = 8 + a + w
while i < #ARGV do
  redis.call('HINCRBYFLOAT', counters, ARGV[i], ARGV[i + 1])
  i = i + 2
end

-- this replica's entries are replaced by what it publishes now; the others' stand until they lapse
local function republish(key, first, count)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local before = {}
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local sep = string.find(m, ' ', 1, true)
    before[string.sub(m, 1, sep - 1)] = true
    if string.sub(m, sep + 1) == me then
      redis.call('ZREM', key, m)
    end
  end
  for j = first, first + count - 1 do
    redis.call('ZADD', key, until_ms, ARGV[j] .. ' ' .. me)
  end
  return before
end

-- counter lift (VTC): a tenant that becomes active rises to the least-served active tenant, or,
-- with none active, to the most-served: idle time banks no credit
local was_active = republish(active, 7, a)
local floor = nil
for t in pairs(was_active) do
  local c = counter(t)
  if floor == nil or c < floor then floor = c end
end
if floor == nil then
  local all = redis.call('HGETALL', counters)
  for k = 1, #all, 2 do
    local x = tonumber(all[k + 1])
    if all[k] ~= '~mean' and (floor == nil or x > floor) then floor = x end
  end
end
for j = 7, 6 + a do
  local t = ARGV[j]
  if not was_active[t] and floor ~= nil and counter(t) < floor then
    redis.call('HSET', counters, t, fmt(floor))
  end
end
republish(waiting, 8 + a, w)

local tenant = ARGV[4]
if tenant == '' then
  return {2}
end
local lowest = nil
for _, m in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  local t = string.sub(m, 1, string.find(m, ' ', 1, true) - 1)
  if t ~= tenant then
    local c = counter(t)
    if lowest == nil or c < lowest then lowest = c end
  end
end
local charge = tonumber(ARGV[5])
local mean = tonumber(redis.call('HGET', counters, '~mean') or ARGV[5])
local lead = lowest and counter(tenant) - lowest or 0
if lead > tonumber(ARGV[3]) * mean then
  return {0, fmt(lead)}
end
redis.call('HINCRBYFLOAT', counters, tenant, ARGV[5])
redis.call('HSET', counters, '~mean', fmt(mean + (charge - mean) * MEAN_RATE))
return {1}
