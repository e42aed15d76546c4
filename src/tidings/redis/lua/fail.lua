-- fail: move a reserved job to the failed store, atomically, while its token matches.
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash
-- KEYS[4] failed zset     KEYS[5] failed info hash   KEYS[6] failed body hash
-- KEYS[7] the receipt of this move ({prefix}:queue:{Q}:rcpt:<token>)
-- KEYS[8] (optional) the job's result channel: waiters of app.result wake and see it failed
-- ARGV[1] job id   ARGV[2] info JSON (made by the worker: exception, name, queue, attempts)
-- ARGV[3] body to keep when the jobs hash has none (may be empty)
-- ARGV[4] the reservation token ('' = not fenced: an operator's move)
-- Returns the failure time in ms (Redis TIME), or -1 when the reservation was lost (the
-- job was handed out again or settled elsewhere: nothing is changed).
-- Run twice: the receipt of the first run answers the second, which changes nothing. A
-- stored payload is never replaced by an empty one.
local rcpt = redis.call('GET', KEYS[7])
if rcpt then return tonumber(rcpt) end
local id = ARGV[1]
if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], id .. ':t') ~= ARGV[4] then return -1 end
-- Fair groups (see pop.lua): a job of a group leaves its group's running set here; its
-- group's keys all derive from the queue's base key (one hash tag). Garbage in a group's
-- structures never stops the move: that bookkeeping runs under pcall.
-- (group_settled, gbase and groups_on: lua/lib/group_settled.lua, prepended)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local body = redis.call('HGET', KEYS[2], id)
if not body or body == '' then
  body = ARGV[3]
  if body == '' then body = redis.call('HGET', KEYS[6], id) or '' end
end
local g = groups_on and redis.call('HGET', KEYS[3], id .. ':g')
redis.call('ZREM', KEYS[1], id)
redis.call('HDEL', KEYS[2], id)
redis.call('HDEL', KEYS[3], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
  id .. ':f', id .. ':g')
if g then pcall(group_settled, id, g, 'f') end
attempts_tidy(KEYS[3])  -- lua/lib/attempts_hashtable.lua, prepended
reserved_tidy(KEYS[1])  -- lua/lib/reserved_skiplist.lua, prepended
-- The group goes with the failed record: `failed retry` puts the job back into it.
if g then redis.call('HSET', KEYS[5], id .. ':g', g) end
redis.call('ZADD', KEYS[4], now, id)
redis.call('HSET', KEYS[5], id, ARGV[2])
redis.call('HSET', KEYS[6], id, body)
if ARGV[4] ~= '' then redis.call('SET', KEYS[7], now, 'PX', 600000) end
if KEYS[8] then redis.call('PUBLISH', KEYS[8], 'failed') end
return now
