-- admit_and_reserve.lua: admit() a job and reserve() its first call in one step. A refused
-- admission reserves nothing; a refused reservation leaves the job admitted.
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] job_id  ARGV[3] num_nodes  ARGV[4] job ttl_s
-- ARGV[5] call_id  ARGV[6] tokens  ARGV[7] call ttl_s
-- Returns {'no_tenant'} | admit()'s refusal | {'admitted', reserve()'s reply...}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
local admitted = admit(now, ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]))
if admitted[1] ~= 'ok' and admitted[1] ~= 'queued' then return admitted end
local reply = reserve(now, ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]))
table.insert(reply, 1, 'admitted')
return reply
