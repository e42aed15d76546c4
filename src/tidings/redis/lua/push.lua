-- push: store job bodies and append their ids to the ready list.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash (id -> envelope)
-- KEYS[4] done zset    KEYS[5] failed zset
-- ARGV    id1, body1, id2, body2, ...
-- Returns the number of jobs pushed.
-- Run twice (a producer re-sending a push whose reply was lost): an id that is queued,
-- running, done or failed already is not pushed again, so it lands once.
local ids = {}
for i = 1, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[3], id, ARGV[i + 1]) == 1 then
    if redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id) then
      redis.call('HDEL', KEYS[3], id)
    else
      ids[#ids + 1] = id
    end
  end
end
-- One RPUSH per 4,000 ids, not one per job (unpack() of more than ~8k values fails).
for s = 1, #ids, 4000 do
  redis.call('RPUSH', KEYS[1], unpack(ids, s, math.min(s + 3999, #ids)))
end
local n = #ids
-- One wake-up token per job, capped: enough to wake every idle worker, never unbounded.
local have = redis.call('LLEN', KEYS[2])
for _ = 1, math.min(n, 64 - have) do
  redis.call('RPUSH', KEYS[2], '1')
end
return n
