-- cancel: a replica that does not own a job asks its owner to cancel it (seen at its next
-- renewal; a claim by another replica sees it at once).
-- KEYS[1] job hash
-- Returns 1 | 0 (ended or gone)
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'ended') then return 0 end
redis.call('HSET', KEYS[1], 'cancel', 1)
return 1
