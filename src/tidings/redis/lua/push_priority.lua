-- push_priority: store job bodies and queue their ids, each at its own priority.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] done zset
-- KEYS[5] failed zset  KEYS[6] attempts hash
-- KEYS[7] priority zset ({prefix}:queue:{Q}:prio)
-- KEYS[8] priority sequence ({prefix}:queue:{Q}:pseq; its existence turns priorities on)
-- ARGV    id1, priority1, body1, id2, priority2, body2, ... (priorities -100..100)
-- Returns the number of jobs pushed.
-- A job of priority 0 goes on the ready list, as push.lua would put it; the others on the
-- priority zset, scored (100 - priority) * 2^45 + sequence: higher priorities first, FIFO
-- among equals. Their priority is kept beside the job (id:p), so a retried, released,
-- recovered or delayed job comes back at it. One script call carries a whole batch of
-- mixed priorities (a producer's dispatch_many), one round trip.
-- Run twice: an id that is queued, running, done or failed already is not pushed again
-- (and takes no sequence number).
local STEP = 35184372088832
-- The sequence is read once and written once: a hand-written one restarts from 0.
local seq0 = tonumber(redis.call('GET', KEYS[8]) or '0') or 0
local seq = seq0
local plain, scored, marks = {}, {}, {}
local n = 0
for i = 1, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[3], id, ARGV[i + 2]) == 1 then
    if redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id) then
      redis.call('HDEL', KEYS[3], id)
    else
      local p = tonumber(ARGV[i + 1]) or 0
      if p == 0 then
        plain[#plain + 1] = id
      else
        seq = seq + 1
        scored[#scored + 1] = string.format('%.0f', (100 - p) * STEP + seq)
        scored[#scored + 1] = id
        marks[#marks + 1] = id .. ':p'
        marks[#marks + 1] = p
      end
      n = n + 1
    end
  end
end

-- Bounded chunks: unpack() of more than ~8k values fails.
local function each_chunk(cmd, key, list)
  for s = 1, #list, 4000 do
    redis.call(cmd, key, unpack(list, s, math.min(s + 3999, #list)))
  end
end
each_chunk('RPUSH', KEYS[1], plain)
each_chunk('ZADD', KEYS[7], scored)
each_chunk('HSET', KEYS[6], marks)
if seq ~= seq0 then redis.call('SET', KEYS[8], seq) end

local have = redis.call('LLEN', KEYS[2])
for _ = 1, math.min(n, 64 - have) do
  redis.call('RPUSH', KEYS[2], '1')
end
return n
