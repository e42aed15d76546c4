-- batch_create: create a batch, count its first jobs in and index it, in one step.
-- KEYS[1] batch hash ({prefix}:batch:{<id>})   KEYS[2] member ids set
-- KEYS[3] (optional) the batch index {prefix}:batches; left out on Redis Cluster, where
--         it lives in another slot and the producer adds the index entry first
-- ARGV[1] batch id   ARGV[2] m, the number of field/value pairs that follow
-- ARGV[3 .. 2 + 2m] batch fields (name, allow_failures, cb:*:q, cb:*:b)
-- ARGV[3 + 2m ..] job ids
-- Returns {total, kind1, queue1, envelope1, ...}: the callbacks listed are those an empty
-- batch fires at once (then, finally).
-- Safe to run twice: a create re-sent after its reply was lost finds the hash and changes
-- nothing (before, the second run reset the counters and, seeing every id counted
-- already, finished the batch at once); it replies what the first run replied, so the
-- producer pushes the same callbacks, which push_once refuses to push twice.
local function reply()
  local out = {tonumber(redis.call('HGET', KEYS[1], 'total'))}
  if redis.call('HGET', KEYS[1], 'finisher') == '-' then
    for _, kind in ipairs({'then', 'finally'}) do
      local q = redis.call('HGET', KEYS[1], 'cb:' .. kind .. ':q')
      if q then
        out[#out + 1] = kind
        out[#out + 1] = q
        out[#out + 1] = redis.call('HGET', KEYS[1], 'cb:' .. kind .. ':b')
      end
    end
  end
  return out
end
if redis.call('EXISTS', KEYS[1]) == 1 then return reply() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'total', 0, 'pending', 0, 'processed', 0, 'failed', 0,
  'created_at', now, 'finished_at', 0, 'cancelled_at', 0)
for i = 3, 2 + 2 * m, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
local n = 0
for i = 3 + 2 * m, #ARGV do
  n = n + redis.call('SADD', KEYS[2], ARGV[i])
end
redis.call('HSET', KEYS[1], 'total', n, 'pending', n)
if n == 0 then
  redis.call('HSET', KEYS[1], 'finished_at', now, 'finisher', '-', 'then_fired', 1)
end
if KEYS[3] then redis.call('ZADD', KEYS[3], now, ARGV[1]) end
return reply()
