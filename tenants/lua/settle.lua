-- settle.lua: close a call at its actual use and add the actual tokens to usage. An open call is
-- refunded `reserved - actual` (negative: charged the excess); a call that expiry reclaimed (full
-- refund) is charged its actual tokens now, to the bucket and today's budget: a settle that comes
-- late is still billed, once. The call id is closed either way. A job id in ARGV[5] is finished
-- too (as finish_job does), whatever the call's state: a job's last call closes both in one step.
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] call_id  ARGV[3] input_tokens
-- ARGV[4] output_tokens  ARGV[5] job_id to finish, or ''
-- Returns 1 when this settled the call (open or reclaimed); 0 when it was unknown, settled or
-- released.
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[8], ARGV[5]) end
reclaim(now)
local input, output = tonumber(ARGV[3]), tonumber(ARGV[4])
local held = close(now, ARGV[2])
if held then
  local tokens, day = parse_open(held)
  refund(now, day, tokens - input - output)
elseif redis.call('ZREM', KEYS[9], ARGV[2]) == 1 then
  refund(now, math.floor(now / DAY_S), -input - output)
else
  return 0
end
redis.call('HINCRBY', KEYS[7], 'input_tokens', input)
redis.call('HINCRBY', KEYS[7], 'output_tokens', output)
redis.call('HINCRBY', KEYS[7], 'settled_calls', 1)
return 1
