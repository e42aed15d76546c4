-- release: put a reserved job back, now or after a delay, while its token matches.
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] reserved zset
-- KEYS[4] notify list  KEYS[5] jobs hash      KEYS[6] attempts hash
-- KEYS[7] the receipt of this move ({prefix}:queue:{Q}:rcpt:<token>)
-- KEYS[8] priority zset   KEYS[9] priority sequence (a job with a priority, id:p, goes
-- back to the zset at it)
-- ARGV[1] job id   ARGV[2] delay ms   ARGV[3] 1 = give the attempt back (middleware release)
-- ARGV[4] 1 = the release follows an exception (counts toward maxExceptions)
-- ARGV[5] the reservation token
-- Returns 1, 0 when the job no longer exists, or -1 when the reservation was lost (the
-- job was handed out again or settled elsewhere: nothing is changed).
-- Run twice: the receipt of the first run answers the second, so an exception is counted
-- and an attempt given back once.
local rcpt = redis.call('GET', KEYS[7])
if rcpt then return tonumber(rcpt) end
local id = ARGV[1]
if redis.call('HEXISTS', KEYS[5], id) == 0 then return 0 end
if redis.call('HGET', KEYS[6], id .. ':t') ~= ARGV[5] then return -1 end
-- A corrupt counter (someone wrote garbage beside the job) would make HINCRBY
-- raise after the ZREM below; start that counter again instead.
for _, field in ipairs({id, id .. ':e'}) do
  local v = redis.call('HGET', KEYS[6], field)
  if v and (#v > 15 or not string.match(v, '^%-?%d+$')) then redis.call('HDEL', KEYS[6], field) end
end
-- Fair groups (see pop.lua): a job of a group leaves its group's running set here and goes
-- back into its group; its group's keys all derive from the queue's base key (one hash
-- tag). Garbage in a group's structures never stops the move (pcall; the plain list).
local gbase = string.sub(KEYS[3], 1, -10)
local groups_on = redis.call('EXISTS', gbase .. ':gon') == 1
-- The queue's count of grouped ready ids ({Q}:gready, see push_group.lua) by n; it goes
-- with the last id, and a count written by hand (garbage) is dropped, never stops a move.
local function gcount(n)
  if n == 0 then return end
  local ok, v = pcall(redis.call, 'INCRBY', gbase .. ':gready', n)
  if not ok or v <= 0 then redis.call('DEL', gbase .. ':gready') end
end
-- Every structure is read before the first write: garbage raises with nothing moved.
local function group_back(id, g, p)
  local gl, gp, ring = gbase .. ':g:' .. g, gbase .. ':gp:' .. g, gbase .. ':gring'
  redis.call('LLEN', gl)
  redis.call('ZCARD', gp)
  local turn = redis.call('ZSCORE', ring, g)
  local paused = redis.call('HGET', gbase .. ':gcfg', 'p:' .. g)
  local prio = p ~= 0 and p >= -100 and p <= 100 and redis.call('EXISTS', KEYS[9]) == 1
  local pseq = prio and redis.call('GET', KEYS[9])
  if pseq and not string.match(pseq, '^%-?%d+$') then
    error({err = 'priority sequence ' .. KEYS[9] .. ' is not an integer'})
  end
  if prio then
    local seq = redis.call('INCR', KEYS[9])
    gcount(redis.call('ZADD', gp, string.format('%.0f', (100 - p) * 35184372088832 + seq), id))
  else
    redis.call('RPUSH', gl, id)
    gcount(1)
  end
  if not turn and not paused then
    local tail = redis.call('ZRANGE', ring, -1, -1, 'WITHSCORES')
    redis.call('ZADD', ring, (tonumber(tail[2]) or 0) + 1, g)
  end
end
local g = groups_on and redis.call('HGET', KEYS[6], id .. ':g')
if redis.call('ZREM', KEYS[3], id) == 0 then
  -- The lease had expired and pop put the id back on the ready list, or on the priority
  -- zset for a job with a priority (no one reserved it since, or the token would
  -- differ): take that copy out, or it would skip the delay.
  redis.call('LREM', KEYS[1], 0, id)
  redis.call('ZREM', KEYS[8], id)
  if g then
    local ok1, a = pcall(redis.call, 'LREM', gbase .. ':g:' .. g, 0, id)
    local ok2, b = pcall(redis.call, 'ZREM', gbase .. ':gp:' .. g, id)
    gcount(-((ok1 and tonumber(a) or 0) + (ok2 and tonumber(b) or 0)))
  end
end
if g then pcall(redis.call, 'SREM', gbase .. ':gr:' .. g, id) end
reserved_tidy(KEYS[3])  -- lua/lib/reserved_skiplist.lua, prepended
redis.call('HDEL', KEYS[6], id .. ':t')
if ARGV[3] == '1' and tonumber(redis.call('HGET', KEYS[6], id) or '0') > 0 then
  redis.call('HINCRBY', KEYS[6], id, -1)
end
if ARGV[4] == '1' then redis.call('HINCRBY', KEYS[6], id .. ':e', 1) end
local delay = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if delay > 0 then
  redis.call('ZADD', KEYS[2], now + delay, id)
else
  local p = tonumber(redis.call('HGET', KEYS[6], id .. ':p') or '0') or 0
  if g and pcall(group_back, id, g, p) then
    -- Back among its group's ready jobs.
  elseif g then
    -- Its group's structures are garbage: parked in the delayed set, never on the plain
    -- list (it would run outside its group's limits); pop tries it again in 5 s and
    -- reports the group each time, until the group is repaired (docs/groups.md).
    redis.call('ZADD', KEYS[2], now + 5000, id)
  elseif p ~= 0 and p >= -100 and p <= 100 and redis.call('EXISTS', KEYS[9]) == 1 then
    local seq = redis.call('INCR', KEYS[9])
    redis.call('ZADD', KEYS[8], string.format('%.0f', (100 - p) * 35184372088832 + seq), id)
  else
    redis.call('RPUSH', KEYS[1], id)
  end
end
if redis.call('LLEN', KEYS[4]) < 64 then redis.call('RPUSH', KEYS[4], '1') end
redis.call('SET', KEYS[7], 1, 'PX', 600000)
return 1
