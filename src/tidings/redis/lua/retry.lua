-- retry: move failed jobs back to the ready list with a fresh attempt count.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] failed zset  KEYS[6] failed info hash   KEYS[7] failed body hash
-- ARGV job ids
-- Returns the number of jobs moved.
local n = 0
for i = 1, #ARGV do
  local id = ARGV[i]
  local body = redis.call('HGET', KEYS[7], id)
  if body then
    redis.call('HSET', KEYS[3], id, body)
    redis.call('HDEL', KEYS[4], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c')
    redis.call('RPUSH', KEYS[1], id)
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id)
    redis.call('HDEL', KEYS[7], id)
    n = n + 1
  end
end
if n > 0 and redis.call('LLEN', KEYS[2]) < 64 then redis.call('RPUSH', KEYS[2], '1') end
return n
