-- retry: move failed jobs back to their queue with a fresh attempt count, each at the
-- priority it failed at.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] failed zset  KEYS[6] failed info hash   KEYS[7] failed body hash
-- KEYS[8] priority zset   KEYS[9] priority sequence (see push_priority.lua)
-- ARGV job ids
-- Returns the number of jobs moved.
-- A job of a fair group (its group kept in the failed info hash as id:g) goes back into
-- its group's ready list (its priority zset for a job with a priority), and the group into
-- the ring unless it is paused (see pop.lua); while its group's structures are garbage it
-- waits in the delayed set (see release.lua).
-- The priority comes from the failure record (its `priority` field, written by the
-- worker from the job's signed body); a record without one, or unreadable, is priority 0.
-- Run twice: the first run took the failed body away, so the second moves nothing.
local STEP = 35184372088832
local function priority_of(id)
  local info = redis.call('HGET', KEYS[6], id)
  if not info or not KEYS[9] then return 0 end
  local ok, rec = pcall(cjson.decode, info)
  if not ok or type(rec) ~= 'table' or type(rec.priority) ~= 'number' then return 0 end
  local p = rec.priority
  if p ~= math.floor(p) or p < -100 or p > 100 then return 0 end
  return p
end
local n = 0
-- Every group structure is read before the first write: garbage raises with nothing moved.
local function regroup(id, g, p)
  local gl, gp, ring = KEYS[1] .. ':g:' .. g, KEYS[1] .. ':gp:' .. g, KEYS[1] .. ':gring'
  redis.call('LLEN', gl)
  redis.call('ZCARD', gp)
  local turn = redis.call('ZSCORE', ring, g)
  local paused = redis.call('HGET', KEYS[1] .. ':gcfg', 'p:' .. g)
  local pseq = p ~= 0 and redis.call('GET', KEYS[9])
  if pseq and not string.match(pseq, '^%-?%d+$') then
    error({err = 'priority sequence ' .. KEYS[9] .. ' is not an integer'})
  end
  if p ~= 0 then
    local seq = redis.call('INCR', KEYS[9])
    redis.call('ZADD', gp, string.format('%.0f', (100 - p) * STEP + seq), id)
  else
    redis.call('RPUSH', gl, id)
  end
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
    local p = priority_of(id)
    redis.call('HSET', KEYS[3], id, body)
    redis.call('HDEL', KEYS[4], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
      id .. ':f', id .. ':g')
    if p ~= 0 then redis.call('HSET', KEYS[4], id .. ':p', p) end
    local g = redis.call('HGET', KEYS[6], id .. ':g')
    if g and redis.call('EXISTS', KEYS[1] .. ':gon') == 1 then
      redis.call('HSET', KEYS[4], id .. ':g', g)
      if not pcall(regroup, id, g, p) then
        -- Its group's structures are garbage: parked in the delayed set (never on the
        -- plain list, outside its group's limits); pop tries it again in 5 s and reports
        -- the group each time, until the group is repaired (docs/groups.md).
        local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1] .. ':delayed', now + 5000, id)
      end
    elseif p ~= 0 then
      local seq = redis.call('INCR', KEYS[9])
      redis.call('ZADD', KEYS[8], string.format('%.0f', (100 - p) * STEP + seq), id)
    else
      redis.call('RPUSH', KEYS[1], id)
    end
    redis.call('ZREM', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id, id .. ':g')
    redis.call('HDEL', KEYS[7], id)
    n = n + 1
  end
end
if n > 0 then attempts_tidy(KEYS[4]) end  -- lua/lib/attempts_hashtable.lua, prepended
if n > 0 and redis.call('LLEN', KEYS[2]) < 64 then redis.call('RPUSH', KEYS[2], '1') end
return n
