-- share: one pool's order across every replica (gateway/share.py). A replica publishes the
-- tenants it has work for, pays what its ended calls owe, and may ask for one call's grant.
-- KEYS[1] counters  hash  tenant -> service per unit of weight (KV token-time / weight);
--                         '~mean': the moving mean of a grant's charge (tenant ids never hold '~')
-- KEYS[2] active    zset  '<tenant> <replica>' -> when it lapses (ms): work ready, taken or running
-- KEYS[3] waiting   zset  '<tenant> <replica> <offset>' -> when it lapses (ms): a ready call it
--                         could send; offset: the least of its jobs' there (gateway/share.py:
--                         per unit of weight, 0 for a policy that orders tenants only; the
--                         job's own key for one that charges nothing, fcfs and las)
-- KEYS[4] reply     string  this exchange's reply, kept ARGV[7] ms under its nonce (replica,
--                           process, sequence): the same exchange sent again (the client's
--                           retry once a reply was lost) is answered with it and runs no more
-- ARGV[1] replica id  ARGV[2] entry ttl ms  ARGV[3] slack, in mean charges
-- ARGV[4] tenant asking for a grant ('': none)  ARGV[5] its charge (cost / weight)
-- ARGV[6] the offset the tenant asks at (its least there)  ARGV[7] how long the reply is kept, ms
-- ARGV[8] a: count of active tenants, then a tenant ids; then w: count of waiting ones, then w
-- pairs of tenant id and offset; then pairs of tenant id, what it owes (charge per unit of
-- weight; negative: a refund)
-- A job comes in the pool's order at its key, counter + offset: by weight, the service at which
-- it would end were it its tenant's only job; otherwise (no charges, counters 0) its own key.
-- Returns {1, key}: granted (charged), at the call's key | {0, lead}: the asking call's key
-- leads the lowest key of another waiting entry by more than the slack | {2}: nothing asked
local counters, active, waiting, me = KEYS[1], KEYS[2], KEYS[3], ARGV[1]
local MEAN_RATE = 0.05
local A = 8  -- where the active tenants' count is

-- '<code>[ <number>]' -> the reply it was
local repeated = redis.call('GET', KEYS[4])
if repeated then
  local s = string.find(repeated, ' ', 1, true)
  if s == nil then return {tonumber(repeated)} end
  return {tonumber(string.sub(repeated, 1, s - 1)), string.sub(repeated, s + 1)}
end

local function reply(r)
  redis.call('SET', KEYS[4], table.concat(r, ' '), 'PX', ARGV[7])
  return r
end

local now = now_ms()
local until_ms = now + tonumber(ARGV[2])

local function counter(t)
  return tonumber(redis.call('HGET', counters, t) or '0')
end

-- '<tenant> <replica>[ <offset>]' -> tenant, replica, offset (0 when absent)
local function parse(m)
  local s1 = string.find(m, ' ', 1, true)
  local s2 = string.find(m, ' ', s1 + 1, true)
  if s2 == nil then
    return string.sub(m, 1, s1 - 1), string.sub(m, s1 + 1), 0
  end
  return string.sub(m, 1, s1 - 1), string.sub(m, s1 + 1, s2 - 1), tonumber(string.sub(m, s2 + 1))
end

-- what ended calls used beyond (or short of) their grants
local a = tonumber(ARGV[A])
local w = tonumber(ARGV[A + 1 + a])
local first_waiting = A + 2 + a
local i = first_waiting + 2 * w
while i < #ARGV do
  redis.call('HINCRBYFLOAT', counters, ARGV[i], ARGV[i + 1])
  i = i + 2
end

-- this replica's entries are replaced by what it publishes now; the others' stand until they lapse
local function republish(key, members)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local before = {}
  for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
    local t, r = parse(m)
    before[t] = true
    if r == me then
      redis.call('ZREM', key, m)
    end
  end
  for _, m in ipairs(members) do
    redis.call('ZADD', key, until_ms, m)
  end
  return before
end

local published_active = {}
for j = A + 1, A + a do
  published_active[#published_active + 1] = ARGV[j] .. ' ' .. me
end
local published_waiting = {}
for j = first_waiting, first_waiting + 2 * w - 1, 2 do
  published_waiting[#published_waiting + 1] = ARGV[j] .. ' ' .. me .. ' ' .. ARGV[j + 1]
end

-- counter lift (VTC): a tenant that becomes active rises to the least-served active tenant, or,
-- with none active, to the most-served: idle time banks no credit
local was_active = republish(active, published_active)
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
for j = A + 1, A + a do
  local t = ARGV[j]
  if not was_active[t] and floor ~= nil and counter(t) < floor then
    redis.call('HSET', counters, t, fmt(floor))
  end
end
republish(waiting, published_waiting)

local tenant = ARGV[4]
if tenant == '' then
  return reply({2})
end
-- the asking call is this replica's own choice among its tenant's jobs here: only the other
-- entries (other tenants anywhere, this tenant on other replicas) can come before it
local lowest = nil
for _, m in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  local t, r, offset = parse(m)
  if t ~= tenant or r ~= me then
    local key = counter(t) + offset
    if lowest == nil or key < lowest then lowest = key end
  end
end
local charge = tonumber(ARGV[5])
local mean = tonumber(redis.call('HGET', counters, '~mean') or ARGV[5])
local key = counter(tenant) + tonumber(ARGV[6])
local lead = lowest and key - lowest or 0
if lead > tonumber(ARGV[3]) * mean then
  return reply({0, fmt(lead)})
end
redis.call('HINCRBYFLOAT', counters, tenant, ARGV[5])
redis.call('HSET', counters, '~mean', fmt(mean + (charge - mean) * MEAN_RATE))
return reply({1, fmt(key)})
