-- ack: delete finished jobs and record them as done.
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash   KEYS[4] done zset
-- ARGV[1] how long done records are kept (ms)   ARGV[2] most done records kept
-- ARGV[3..] job ids
-- Returns the number of ids whose reservation had already been lost (expired and
-- handed out again); their bodies are deleted too, so a stale copy is not run again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = 0
for i = 3, #ARGV do
  local id = ARGV[i]
  if redis.call('ZREM', KEYS[1], id) == 0 then lost = lost + 1 end
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id, id .. ':e')
  redis.call('ZADD', KEYS[4], now, id)
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[1]))
redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -(tonumber(ARGV[2]) + 1))
return lost
