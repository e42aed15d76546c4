-- retry: move failed jobs back to the ready list with a fresh attempt count.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] failed zset  KEYS[6] failed info hash   KEYS[7] failed body hash
-- ARGV job ids
-- Returns the number of jobs moved.
-- A job of a fair group (its group kept in the failed info hash as id:g) goes back into
-- its group's ready list, and the group into the ring unless it is paused (see pop.lua);
-- while its group's structures are garbage it waits in the delayed set (see release.lua).
local n = 0
-- Every group structure is read before the first write: garbage raises with nothing moved.
local function regroup(id, g)
  local gl, ring = KEYS[1] .. ':g:' .. g, KEYS[1] .. ':gring'
  redis.call('LLEN', gl)
  local turn = redis.call('ZSCORE', ring, g)
  local paused = redis.call('HGET', KEYS[1] .. ':gcfg', 'p:' .. g)
  redis.call('RPUSH', gl, id)
  local ok, v = pcall(redis.call, 'INCR', KEYS[1] .. ':gready')  -- see push_group.lua
  if not ok or v <= 0 then redis.call('DEL', KEYS[1] .. ':gready') end
  if not turn and not paused then
    local tail = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
    redis.call('ZADD', ring, (tonumber(tail[2]) or 0) + 1, g)
  end
end
for i = 1, #ARGV do
  local id = ARGV[i]
  local body = redis.call('HGET', KEYS[7], id)
  if body then
    redis.call('HSET', KEYS[3], id, body)
    redis.call('HDEL', KEYS[4], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
      id .. ':g')
    local g = redis.call('HGET', KEYS[6], id .. ':g')
    if g and redis.call('EXISTS', KEYS[1] .. ':gon') == 1 then
      redis.call('HSET', KEYS[4], id .. ':g', g)
      if not pcall(regroup, id, g) then
        -- Its group's structures are garbage: parked in the delayed set (never on the
        -- plain list, outside its group's limits); pop tries it again in 5 s and reports
        -- the group each time, until the group is repaired (docs/groups.md).
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1] .. ':delayed', now + 5000, id)
      end
    else
      redis.call('RPUSH', KEYS[1], id)
    end
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id, id .. ':g')
    redis.call('HDEL', KEYS[7], id)
    n = n + 1
  end
end
if n > 0 and redis.call('LLEN', KEYS[2]) < 64 then redis.call('RPUSH', KEYS[2], '1') end
return n
