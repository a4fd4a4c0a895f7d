-- admit_job.lua: admit() a job (see _lib.lua).
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] job_id  ARGV[3] num_nodes  ARGV[4] ttl_s
-- Returns admit()'s reply, or {'no_tenant'}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
return admit(now, ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
