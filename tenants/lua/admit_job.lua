-- admit_job.lua: count a job against max_queued_jobs until finished or expired, after checking
-- max_nodes_per_job; a job id already queued is left as it is.
-- KEYS[1..8], ARGV[1]: as in _lib.lua.  ARGV[2] job_id  ARGV[3] num_nodes  ARGV[4] ttl_s
-- Returns {'ok'} | {'queued'} | {'no_tenant'} | {'nodes', limit} | {'jobs', limit, queued}
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return {'no_tenant'} end
redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', fmt(now))
local job_id, num_nodes, ttl = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('ZSCORE', KEYS[8], job_id) then return {'queued'} end
local max_nodes = quota_int('max_nodes_per_job')
if max_nodes > 0 and num_nodes > max_nodes then return {'nodes', max_nodes} end
local max_jobs, queued = quota_int('max_queued_jobs'), redis.call('ZCARD', KEYS[8])
if max_jobs > 0 and queued >= max_jobs then return {'jobs', max_jobs, queued} end
redis.call('ZADD', KEYS[8], fmt(now + ttl), job_id)
return {'ok'}
