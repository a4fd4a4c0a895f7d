-- release.lua: close an open call without use (cancelled or failed): refund all it holds.
-- The call id is closed either way, so a reserve that arrives late cannot reopen it. A call that
-- expiry reclaimed is left as it is: it was refunded already, and a late settle may still charge.
-- KEYS[1..9], ARGV[1]: as in _lib.lua.  ARGV[2] call_id
-- Returns 1 when this released the call; 0 when it was not open (unknown, closed, reclaimed).
local now = clock()
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
reclaim(now)
local held = close(now, ARGV[2])
if not held then return 0 end
local tokens, day = parse_open(held)
refund(now, day, tokens)
return 1
