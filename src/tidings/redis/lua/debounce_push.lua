-- debounce_push: keep only the last dispatch of a debounced id within its window.
-- KEYS[1] delayed zset   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] debounce state hash ({prefix}:queue:{Q}:debounce:<name>: id, first)
-- KEYS[6] priority sequence ({prefix}:queue:{Q}:pseq; created for a priority: priorities on)
-- ARGV[1] job id   ARGV[2] envelope   ARGV[3] window ms   ARGV[4] max wait ms (0: none)
-- ARGV[5] priority (-100..100; absent: 0), kept beside the job (id:p): the pop that
-- promotes it when due queues it where its priority says
-- Returns {id, due_ms, replaced id or ''}.
-- A dispatch replaces the job still waiting from an earlier dispatch of the same name and
-- moves the due time to now + window, but never past first dispatch + max wait. Once the
-- waiting job has been promoted (it is running or ran), the next dispatch opens a new window.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window, max_wait = tonumber(ARGV[3]), tonumber(ARGV[4])
local cur = redis.call('HGET', KEYS[5], 'id')
local first = now
local replaced = ''
if cur and redis.call('ZSCORE', KEYS[1], cur) then
  redis.call('ZREM', KEYS[1], cur)
  redis.call('HDEL', KEYS[3], cur)
  redis.call('HDEL', KEYS[4], cur, cur .. ':e', cur .. ':t', cur .. ':s', cur .. ':p', cur .. ':c')
  attempts_tidy(KEYS[4])  -- lua/lib/attempts_hashtable.lua, prepended
  first = tonumber(redis.call('HGET', KEYS[5], 'first')) or now
  replaced = cur
end
local due = now + window
if max_wait > 0 and due > first + max_wait then due = math.max(now, first + max_wait) end
redis.call('HSET', KEYS[5], 'id', ARGV[1], 'first', first)
redis.call('PEXPIRE', KEYS[5], due - now + window + 1000)
redis.call('HSET', KEYS[3], ARGV[1], ARGV[2])
local p = tonumber(ARGV[5] or '0') or 0
if p ~= 0 and KEYS[6] then
  redis.call('HSET', KEYS[4], ARGV[1] .. ':p', p)
  redis.call('SETNX', KEYS[6], 0)
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[1], due, ARGV[1])
if (head[2] == nil or due < tonumber(head[2])) and redis.call('LLEN', KEYS[2]) < 64 then
  redis.call('RPUSH', KEYS[2], '1')
end
return {ARGV[1], due, replaced}
