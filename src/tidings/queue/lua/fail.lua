-- fail: move a job from reserved (or anywhere) to the failed store, atomically.
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash
-- KEYS[4] failed zset     KEYS[5] failed info hash   KEYS[6] failed body hash
-- ARGV[1] job id   ARGV[2] info JSON (made by the worker: exception, name, queue, attempts)
-- ARGV[3] body to keep when the jobs hash has none (may be empty)
-- Returns the failure time in ms (Redis TIME).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local body = redis.call('HGET', KEYS[2], id) or ARGV[3]
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id, id .. ':e')
redis.call('ZADD', KEYS[4], now, id)
redis.call('HSET', KEYS[5], id, ARGV[2])
redis.call('HSET', KEYS[6], id, body)
return now
