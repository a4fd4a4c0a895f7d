-- revoke_key.lua: revoke a tenant's API key in one step: its record and its entry in the
-- tenant's key set go together, so a failure never leaves half a revocation that a retry
-- cannot see.
-- KEYS[1] the key record `<prefix>:key:<key_id>` (outside the tenant's slot)
-- KEYS[2] the tenant's key set of key ids
-- ARGV[1] tenant_id  ARGV[2] key_id
-- Returns 1 when revoked, 0 when no key of that id is live (its key set entry, if any, goes:
-- it named a record already gone), -1 when the live key of that id is another tenant's (nothing
-- is written).
local owner = redis.call('HGET', KEYS[1], 'tenant_id')
if not owner then
  redis.call('SREM', KEYS[2], ARGV[2])
  return 0
end
if owner ~= ARGV[1] then return -1 end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[2])
return 1
