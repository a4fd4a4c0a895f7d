-- delete_tenant.lua: remove a tenant in one step: its key records, its quota state, its key set
-- and its registry entry, so no key of a deleted tenant keeps working.
-- The key records `<ARGV[2]><key_id>` live outside the tenant's slot and only the key set names
-- them, so this script derives those key names itself instead of taking them in KEYS: it needs a
-- single Redis instance (or a deployment that keeps every key of the store in one slot).
-- KEYS[1..9] the tenant's quota keys (as in _lib.lua)  KEYS[10] the tenant's key set
-- KEYS[11] registry set of tenant ids (outside the slot)
-- KEYS[12] this deletion's reply, kept under its nonce (`replied`)
-- ARGV[1] tenant_id  ARGV[2] key record prefix, `<prefix>:key:`
-- Returns 1 when deleted, 0 when the tenant does not exist.
if replied(KEYS[12]) then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, key_id in ipairs(redis.call('SMEMBERS', KEYS[10])) do
  redis.call('DEL', ARGV[2] .. key_id)
end
redis.call('DEL', unpack(KEYS, 1, 10))
redis.call('SREM', KEYS[11], ARGV[1])
keep_reply(KEYS[12], '1')
return 1
