-- push_priority: store job bodies and queue their ids by priority (a priority other than 0).
-- KEYS[1] priority zset ({prefix}:queue:{Q}:prio)   KEYS[2] notify list
-- KEYS[3] jobs hash   KEYS[4] done zset   KEYS[5] failed zset   KEYS[6] attempts hash
-- KEYS[7] priority sequence ({prefix}:queue:{Q}:pseq; its existence turns priorities on)
-- ARGV[1] priority (-100..100, not 0)   ARGV[2..] id1, body1, id2, body2, ...
-- Returns the number of jobs pushed.
-- Score (100 - priority) * 2^45 + sequence: higher priorities first, FIFO among equals.
-- The priority is kept beside the job (id:p), so a retried, released, recovered or
-- delayed job comes back at it.
-- Run twice: an id that is queued, running, done or failed already is not pushed again.
local p = tonumber(ARGV[1])
local STEP = 35184372088832
local n = 0
for i = 2, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[3], id, ARGV[i + 1]) == 1 then
    if redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id) then
      redis.call('HDEL', KEYS[3], id)
    else
      local seq = redis.call('INCR', KEYS[7])
      redis.call('ZADD', KEYS[1], string.format('%.0f', (100 - p) * STEP + seq), id)
      redis.call('HSET', KEYS[6], id .. ':p', p)
      n = n + 1
    end
  end
end
local have = redis.call('LLEN', KEYS[2])
for _ = 1, math.min(n, 64 - have) do
  redis.call('RPUSH', KEYS[2], '1')
end
return n
