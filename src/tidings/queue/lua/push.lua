-- push: store job bodies and append their ids to the ready list.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash (id -> envelope)
-- ARGV    id1, body1, id2, body2, ...
-- Returns the number of jobs pushed.
local n = 0
for i = 1, #ARGV, 2 do
  redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  redis.call('RPUSH', KEYS[1], ARGV[i])
  n = n + 1
end
-- One wake-up token per job, capped: enough to wake every idle worker, never unbounded.
local have = redis.call('LLEN', KEYS[2])
for _ = 1, math.min(n, 64 - have) do
  redis.call('RPUSH', KEYS[2], '1')
end
return n
