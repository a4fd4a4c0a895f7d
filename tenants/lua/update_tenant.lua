-- update_tenant.lua: overwrite fields of an existing tenant record (never creates one).
-- KEYS[1] tenant hash (as in _lib.lua).  ARGV[1..] field, value, ...
-- Returns 1 when updated, 0 when the tenant does not exist.
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if #ARGV > 0 then redis.call('HSET', KEYS[1], unpack(ARGV)) end
return 1
