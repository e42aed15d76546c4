-- push_once: push a job whose id was fixed in advance, at most once (chain links,
-- chain catch and batch callbacks, scheduler ticks).
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] notify list   KEYS[4] jobs hash
-- KEYS[5] once marker of this id ({prefix}:queue:{Q}:once:<id>)
-- ARGV[1] job id   ARGV[2] envelope   ARGV[3] delay ms (0: ready now)
-- ARGV[4] how long the marker is kept (ms)
-- ARGV[5] (optional) priority, -100..100; when not 0: KEYS[6] priority zset,
-- KEYS[7] priority sequence, KEYS[8] attempts hash (see push_priority.lua)
-- Returns 1 when pushed, 0 when the id was pushed before (marker set) or is queued now.
-- The marker outlives the job, so a link re-pushed by a re-delivered predecessor after
-- it already ran and was acknowledged is refused rather than run a second time.
local id = ARGV[1]
if redis.call('SET', KEYS[5], '1', 'NX', 'PX', tonumber(ARGV[4])) == false then return 0 end
if redis.call('HEXISTS', KEYS[4], id) == 1 then return 0 end
redis.call('HSET', KEYS[4], id, ARGV[2])
local delay = tonumber(ARGV[3])
local p = tonumber(ARGV[5] or '0')
if p ~= 0 then
  redis.call('HSET', KEYS[8], id .. ':p', p)
  redis.call('SETNX', KEYS[7], 0)
end
if delay <= 0 and p ~= 0 then
  local seq = redis.call('INCR', KEYS[7])
  redis.call('ZADD', KEYS[6], string.format('%.0f', (100 - p) * 35184372088832 + seq), id)
elseif delay > 0 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZADD', KEYS[2], now + delay, id)
else
  redis.call('RPUSH', KEYS[1], id)
end
if redis.call('LLEN', KEYS[3]) < 64 then redis.call('RPUSH', KEYS[3], '1') end
return 1
