-- release: put a reserved job back, now or after a delay.
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] reserved zset
-- KEYS[4] notify list  KEYS[5] jobs hash      KEYS[6] attempts hash
-- ARGV[1] job id   ARGV[2] delay ms   ARGV[3] 1 = give the attempt back (middleware release)
-- ARGV[4] 1 = the release follows an exception (counts toward maxExceptions)
-- Returns 1, or 0 when the job no longer exists (finished by another worker).
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[5], id) == 0 then return 0 end
-- A corrupt counter (issue 12: someone wrote garbage beside the job) would make HINCRBY
-- raise after the ZREM below; start that counter again instead.
for _, field in ipairs({id, id .. ':e'}) do
  local v = redis.call('HGET', KEYS[6], field)
  if v and (#v > 15 or not string.match(v, '^%-?%d+$')) then redis.call('HDEL', KEYS[6], field) end
end
redis.call('ZREM', KEYS[3], id)
if ARGV[3] == '1' then redis.call('HINCRBY', KEYS[6], id, -1) end
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[6], id .. ':e', 1) end
local delay = tonumber(ARGV[2])
if delay > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + delay, id)
else
  redis.call('RPUSH', KEYS[1], id)
end
if redis.call('LLEN', KEYS[4]) < 64 then redis.call('RPUSH', KEYS[4], '1') end
return 1
