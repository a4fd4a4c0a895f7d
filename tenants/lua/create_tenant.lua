-- create_tenant.lua: write a tenant record unless one exists, stamped with Redis TIME, and list
-- it in the registry in the same step.
-- KEYS[1] tenant hash (as in _lib.lua)  KEYS[2] registry set of tenant ids (outside the slot)
-- KEYS[3] this creation's reply, kept under its nonce (`replied`)
-- ARGV[1] tenant_id  ARGV[2] display_name  ARGV[3..] quota field, value, ...
-- Returns created_at, or false when the tenant already exists.
local earlier = replied(KEYS[3])
if earlier then return earlier end
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local created_at = fmt(clock())
redis.call('HSET', KEYS[1], 'display_name', ARGV[2], 'created_at', created_at,
  unpack(ARGV, 3))
redis.call('SADD', KEYS[2], ARGV[1])
return keep_reply(KEYS[3], created_at)
