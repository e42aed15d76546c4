-- unique_push: push a unique job only when no job holds its unique lock.
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] notify list   KEYS[4] jobs hash
-- KEYS[5] unique lock ({prefix}:queue:{Q}:unique:<name>)   KEYS[6] done zset
-- KEYS[7] failed zset   KEYS[8] attempts hash   KEYS[9] priority zset
-- KEYS[10] priority sequence (see push_priority.lua)
-- ARGV[1] job id   ARGV[2] envelope   ARGV[3] delay ms   ARGV[4] lock expiry ms
-- ARGV[5] priority (-100..100; absent: 0): kept beside the job (id:p) as push_priority
-- does, so the job runs, and comes back from a delay, a release or a stall, at it
-- Returns {1, id} when pushed, {0, holder id} when dropped because a job holds the lock.
-- A lock whose holder no longer exists (finished without unlocking, or cleared) is taken
-- over, so a crash can block a unique id for no longer than it takes to notice.
-- Run twice (a re-sent dispatch whose reply was lost): the job holding the lock, or
-- already done or failed, is this very id, so the answer is {1, id} again and nothing
-- is pushed twice.
local id = ARGV[1]
local holder = redis.call('GET', KEYS[5])
if holder == id or redis.call('ZSCORE', KEYS[6], id) or redis.call('ZSCORE', KEYS[7], id) then
  return {1, id}
end
if holder and redis.call('HEXISTS', KEYS[4], holder) == 1 then
  return {0, holder}
end
redis.call('SET', KEYS[5], id, 'PX', tonumber(ARGV[4]))
redis.call('HSET', KEYS[4], id, ARGV[2])
local delay = tonumber(ARGV[3])
local p = tonumber(ARGV[5] or '0') or 0
if p ~= 0 then
  redis.call('HSET', KEYS[8], id .. ':p', p)
  redis.call('SETNX', KEYS[10], 0)
end
if delay > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + delay, id)
elseif p ~= 0 then
  local seq = redis.call('INCR', KEYS[10])
  redis.call('ZADD', KEYS[9], string.format('%.0f', (100 - p) * 35184372088832 + seq), id)
else
  redis.call('RPUSH', KEYS[1], id)
end
if redis.call('LLEN', KEYS[3]) < 64 then redis.call('RPUSH', KEYS[3], '1') end
return {1, id}
