-- retry: move failed jobs back to their queue with a fresh attempt count, each at the
-- priority it failed at.
-- KEYS[1] ready list   KEYS[2] notify list   KEYS[3] jobs hash   KEYS[4] attempts hash
-- KEYS[5] failed zset  KEYS[6] failed info hash   KEYS[7] failed body hash
-- KEYS[8] priority zset   KEYS[9] priority sequence (see push_priority.lua)
-- ARGV job ids
-- Returns the number of jobs moved.
-- A job of a fair group (its group kept in the failed info hash as id:g) goes back into
-- its group's ready list (its priority zset for a job with a priority), and the group into
-- the ring unless it is paused (see pop.lua).
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
local function regroup(id, g, p)
  if p ~= 0 then
    local seq = redis.call('INCR', KEYS[9])
    redis.call('ZADD', KEYS[1] .. ':gp:' .. g, string.format('%.0f', (100 - p) * STEP + seq), id)
  else
    redis.call('RPUSH', KEYS[1] .. ':g:' .. g, id)
  end
  redis.call('HSET', KEYS[4], id .. ':g', g)
  local ring = KEYS[1] .. ':gring'
  if not redis.call('ZSCORE', ring, g) and not redis.call('HGET', KEYS[1] .. ':gcfg', 'p:' .. g) then
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
      id .. ':g')
    if p ~= 0 then redis.call('HSET', KEYS[4], id .. ':p', p) end
    local g = redis.call('HGET', KEYS[6], id .. ':g')
    if g and redis.call('EXISTS', KEYS[1] .. ':gon') == 1 and pcall(regroup, id, g, p) then
      -- back in its group
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
if n > 0 and redis.call('LLEN', KEYS[2]) < 64 then redis.call('RPUSH', KEYS[2], '1') end
return n
