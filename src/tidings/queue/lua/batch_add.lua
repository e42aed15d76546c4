-- batch_add: create a batch, or count more jobs into one, before they are pushed.
-- KEYS[1] batch hash ({prefix}:batch:{<id>})   KEYS[2] member ids set
-- ARGV[1] 'create' | 'add'   ARGV[2] m, the number of field/value pairs that follow
-- ARGV[3 .. 2 + 2m] batch fields to set on create (name, allow_failures, cb:*:q, cb:*:b)
-- ARGV[3 + 2m ..] job ids
-- Returns {code, kind1, queue1, envelope1, ...}: code >= 0 is the number of ids newly
-- counted (an id counted before is not counted again, so a re-delivered job that adds the
-- same jobs twice does not inflate the batch); -1: the batch has finished; -2: no such
-- batch. A batch created empty finishes at once and returns its then/finally callbacks.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local m = tonumber(ARGV[2])
if ARGV[1] == 'create' then
  redis.call('HSET', KEYS[1], 'total', 0, 'pending', 0, 'processed', 0, 'failed', 0,
    'created_at', now, 'finished_at', 0, 'cancelled_at', 0)
  for i = 3, 2 + 2 * m, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
else
  if redis.call('EXISTS', KEYS[1]) == 0 then return {-2} end
  if redis.call('HGET', KEYS[1], 'finished_at') ~= '0' then return {-1} end
end
local n = 0
for i = 3 + 2 * m, #ARGV do
  n = n + redis.call('SADD', KEYS[2], ARGV[i])
end
redis.call('HINCRBY', KEYS[1], 'total', n)
redis.call('HINCRBY', KEYS[1], 'pending', n)
local out = {n}
if ARGV[1] == 'create' and n == 0 then
  redis.call('HSET', KEYS[1], 'finished_at', now, 'finisher', '-', 'then_fired', 1)
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
