-- create_tenant.lua: write a tenant record unless one exists, stamped with Redis TIME.
-- KEYS[1] tenant hash (as in _lib.lua).  ARGV[1] display_name  ARGV[2..] quota field, value, ...
-- Returns created_at, or false when the tenant already exists.
if redis.call('EXISTS', KEYS[1]) == 1 then return false end
local created_at = fmt(clock())
redis.call('HSET', KEYS[1], 'display_name', ARGV[1], 'created_at', created_at,
  unpack(ARGV, 2))
return created_at
