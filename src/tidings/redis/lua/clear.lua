-- clear: delete up to ARGV[1] waiting jobs (ready, then delayed) with their bodies.
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] (optional) priority zset: cleared after the ready list
-- Returns the number deleted; call again until 0.
local chunk = tonumber(ARGV[1])
local ids = redis.call('LPOP', KEYS[1], chunk) or {}
if KEYS[5] and #ids < chunk then
  local more = redis.call('ZRANGE', KEYS[5], 0, chunk - #ids - 1)
  if #more > 0 then
    redis.call('ZREM', KEYS[5], unpack(more))
    for _, id in ipairs(more) do ids[#ids + 1] = id end
  end
end
if #ids < chunk then
  local more = redis.call('ZRANGE', KEYS[2], 0, chunk - #ids - 1)
  if #more > 0 then
    redis.call('ZREM', KEYS[2], unpack(more))
    for _, id in ipairs(more) do ids[#ids + 1] = id end
  end
end
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[3], id)
  redis.call('HDEL', KEYS[4], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
    id .. ':f')
end
if #ids > 0 then attempts_tidy(KEYS[4]) end  -- lua/lib/attempts_hashtable.lua, prepended
return #ids
