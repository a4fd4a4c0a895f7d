-- reserve.lua: reserve() tokens for one call (see _lib.lua).
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] call_id  ARGV[3] tokens  ARGV[4] ttl_s
-- Returns reserve()'s reply, or {'no_tenant'}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
return reserve(now, ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
