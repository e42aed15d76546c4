-- batch_add: count more jobs into an existing batch, before they are pushed
-- (lua/batch_create.lua creates one).
-- KEYS[1] batch hash ({prefix}:batch:{<id>})   KEYS[2] member ids set
-- ARGV job ids
-- Returns {code}: code >= 0 is the number of ids newly counted (an id counted before is
-- not counted again, so a re-delivered job that adds the same jobs twice, or an add
-- re-sent after its reply was lost, does not inflate the batch); -1: the batch has
-- finished; -2: no such batch.
if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
if redis.call('HGET', KEYS[1], 'finished_at') ~= '0' then return {-1} end
local n = 0
for i = 1, #ARGV do
  n = n + redis.call('SADD', KEYS[2], ARGV[i])
end
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('HINCRBY', KEYS[1], 'pending', n)
return {n}
