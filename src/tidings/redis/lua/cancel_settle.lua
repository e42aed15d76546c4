-- cancel_settle: a worker records a cancelled job as cancelled (it never ran, or its run
-- was cancelled), while its reservation token matches.
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash   KEYS[4] cancelled zset
-- KEYS[5] the receipt of this move ({prefix}:queue:{Q}:rcpt:<token>)
-- KEYS[6] the job's result channel (waiters of app.result wake and see it cancelled)
-- ARGV[1] job id   ARGV[2] the reservation token
-- ARGV[3] how long cancelled records are kept (ms)   ARGV[4] most cancelled records kept
-- Returns 1, or -1 when the reservation was lost (nothing changed).
-- Run twice: the receipt of the first run answers the second.
local rcpt = redis.call('GET', KEYS[5])
if rcpt then return tonumber(rcpt) end
local id = ARGV[1]
if redis.call('HGET', KEYS[3], id .. ':t') ~= ARGV[2] then return -1 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Fair groups (see pop.lua): a job of a group leaves its group's running set here; its
-- group's keys all derive from the queue's base key (one hash tag). Garbage in a group's
-- structures never stops the move: that bookkeeping runs under pcall.
-- (group_settled, gbase and groups_on: lua/lib/group_settled.lua, prepended)
local g = groups_on and redis.call('HGET', KEYS[3], id .. ':g')
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
  id .. ':f', id .. ':g')
if g then pcall(group_settled, id, g, nil) end
attempts_tidy(KEYS[3])  -- lua/lib/attempts_hashtable.lua, prepended
reserved_tidy(KEYS[1])  -- lua/lib/reserved_skiplist.lua, prepended
redis.call('ZADD', KEYS[4], now, id)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[3]))
redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -(tonumber(ARGV[4]) + 1))
redis.call('SET', KEYS[5], 1, 'PX', 600000)
redis.call('PUBLISH', KEYS[6], 'cancelled')
return 1
