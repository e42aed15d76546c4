-- later: store job bodies and schedule their ids on the delayed zset.
-- KEYS[1] delayed zset   KEYS[2] notify list   KEYS[3] jobs hash
-- KEYS[4] done zset      KEYS[5] failed zset   KEYS[6] attempts hash
-- KEYS[7] priority sequence (created when the priority is not 0: priorities on)
-- ARGV[1] delay in milliseconds (measured on Redis's clock, never the caller's)
-- ARGV[2..] id1, priority1, body1, id2, priority2, body2, ... (priorities -100..100; one
-- other than 0 is kept beside its job as id:p, used when it becomes ready)
-- Returns the due time in milliseconds (Redis TIME).
-- Run twice: an id that is queued, running, done or failed already is left as it is.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local due = now + tonumber(ARGV[1])
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local prio_on = false
for i = 2, #ARGV, 3 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[3], id, ARGV[i + 2]) == 1 then
    if redis.call('ZSCORE', KEYS[4], id) or redis.call('ZSCORE', KEYS[5], id) then
      redis.call('HDEL', KEYS[3], id)
    else
      redis.call('ZADD', KEYS[1], due, id)
      local p = tonumber(ARGV[i + 1]) or 0
      if p ~= 0 then
        redis.call('HSET', KEYS[6], id .. ':p', p)
        prio_on = true
      end
    end
  end
end
if prio_on then redis.call('SETNX', KEYS[7], 0) end
-- A sleeping worker waits until the earliest due time it knew of; wake one so it can
-- shorten its wait when this job became the new head.
if (head[2] == nil or due < tonumber(head[2])) and redis.call('LLEN', KEYS[2]) < 64 then
  redis.call('RPUSH', KEYS[2], '1')
end
return due
