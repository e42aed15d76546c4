-- group_clear: delete up to ARGV[2] waiting jobs of fair group ARGV[1] with their bodies
-- (the operator's `clear` of a queue, group by group).
-- KEYS[1] ring of groups ({Q}:gring)   KEYS[2] jobs hash   KEYS[3] attempts hash
-- KEYS[4] the group's ready list   KEYS[5] its priority zset   KEYS[6] group counts ({Q}:gstat)
-- KEYS[7] the group's running set
-- Returns the number deleted; call again until 0. Running jobs are left to finish.
-- Run twice: what is gone stays gone; the second run deletes the next chunk, as a next
-- call would.
local g, chunk = ARGV[1], tonumber(ARGV[2])
local ids = redis.call('LPOP', KEYS[4], chunk) or {}
if #ids < chunk then
  local more = redis.call('ZRANGE', KEYS[5], 0, chunk - #ids - 1)
  if #more > 0 then
    redis.call('ZREM', KEYS[5], unpack(more))
    for _, id in ipairs(more) do ids[#ids + 1] = id end
  end
end
local count = string.sub(KEYS[1], 1, -7) .. ':gready'  -- grouped ready ids of the queue
if #ids > 0 then
  local ok, v = pcall(redis.call, 'DECRBY', count, #ids)
  if not ok or v <= 0 then redis.call('DEL', count) end
end
for _, id in ipairs(ids) do
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
    id .. ':f', id .. ':g')
end
if #ids > 0 then attempts_tidy(KEYS[3]) end  -- lua/lib/attempts_hashtable.lua, prepended
if redis.call('LLEN', KEYS[4]) == 0 and redis.call('EXISTS', KEYS[5]) == 0 then
  redis.call('ZREM', KEYS[1], g)
  if redis.call('SCARD', KEYS[7]) == 0 then redis.call('HDEL', KEYS[6], 'd:' .. g, 'f:' .. g) end
end
return #ids
