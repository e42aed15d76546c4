-- batch_cancel: mark a batch cancelled; its jobs that have not started yet are skipped.
-- KEYS[1] batch hash
-- Returns 1 when cancelled now, 0 when it was cancelled or finished before, -1 when there
-- is no such batch.
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('HGET', KEYS[1], 'finished_at') ~= '0' then return 0 end
if redis.call('HGET', KEYS[1], 'cancelled_at') ~= '0' then return 0 end
local t = redis.call('TIME')
redis.call('HSET', KEYS[1], 'cancelled_at',
  tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
return 1
