-- digest_add: append one item to the open digest window of (notifiable, type, channel),
-- opening the window (and scheduling its flush job) when none is open.
-- KEYS[1] items list   ({prefix}:queue:{Q}:digest:<name>)
-- KEYS[2] seen zset    ({prefix}:queue:{Q}:digest:<name>:seen, item id -> ms)
-- KEYS[3] window       ({prefix}:queue:{Q}:digest:<name>:window, the open window's id)
-- KEYS[4] delayed zset   KEYS[5] notify list   KEYS[6] jobs hash (of queue Q)
-- ARGV[1] item id   ARGV[2] item record   ARGV[3] window ms
-- ARGV[4] window id (= the flush job's id) to open if none is open
-- ARGV[5] the flush job's envelope   ARGV[6] how long item ids are remembered (ms)
-- Returns {added 1/0, window id, opened 1/0}. An item id seen before (a re-sent command
-- whose reply was lost) is not appended again: an item is in one window only.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local keep = tonumber(ARGV[6])
local w = redis.call('GET', KEYS[3])
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return {0, w or '', 0} end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - keep)
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('RPUSH', KEYS[1], ARGV[2])
if w then return {1, w, 0} end
local window = tonumber(ARGV[3])
w = ARGV[4]
redis.call('SET', KEYS[3], w, 'PX', window + keep)
redis.call('HSET', KEYS[6], w, ARGV[5])
local due = now + window
local head = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
redis.call('ZADD', KEYS[4], due, w)
if (head[2] == nil or due < tonumber(head[2])) and redis.call('LLEN', KEYS[5]) < 64 then
  redis.call('RPUSH', KEYS[5], '1')
end
return {1, w, 1}
