-- issue_key.lua: store a new API key of an existing tenant, stamped with Redis TIME: the key's
-- record and the tenant's key set change together or not at all, so no key outlives its tenant.
-- KEYS[1] tenant hash (as in _lib.lua)  KEYS[2] the tenant's key set of key ids
-- KEYS[3] the key record `<prefix>:key:<key_id>` (outside the tenant's slot)
-- ARGV[1] tenant_id  ARGV[2] key_id  ARGV[3] key_hash  ARGV[4] the most live keys a tenant holds
-- Returns 1 when stored, 0 when the tenant does not exist, -1 when it holds the most keys
-- (nothing is written either way).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('SCARD', KEYS[2]) >= tonumber(ARGV[4]) then return -1 end
redis.call('HSET', KEYS[3], 'tenant_id', ARGV[1], 'key_hash', ARGV[3], 'created_at', fmt(clock()))
redis.call('SADD', KEYS[2], ARGV[2])
return 1
