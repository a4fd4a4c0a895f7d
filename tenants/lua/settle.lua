-- settle.lua: close an open call at its actual use: refund `reserved - actual` (negative: charge
-- the excess) and add the actual tokens to usage. The call id is closed either way. A job id in
-- ARGV[5] is finished too (as finish_job does), whatever the call's state: a job's last call
-- closes both in one step.
-- KEYS[1..8], ARGV[1]: as in _lib.lua.  ARGV[2] call_id  ARGV[3] input_tokens
-- ARGV[4] output_tokens  ARGV[5] job_id to finish, or ''
-- Returns 1 when this settled the call; 0 when it was not open (unknown, closed, expired).
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[8], ARGV[5]) end
reclaim(now)
local held = close(now, ARGV[2])
if not held then return 0 end
local input, output = tonumber(ARGV[3]), tonumber(ARGV[4])
local tokens, day = parse_open(held)
refund(now, day, tokens - input - output)
redis.call('HINCRBY', KEYS[7], 'input_tokens', input)
redis.call('HINCRBY', KEYS[7], 'output_tokens', output)
redis.call('HINCRBY', KEYS[7], 'settled_calls', 1)
return 1
