-- group_admin: an operator's change to one fair group of a queue (see pop.lua).
-- KEYS[1] group settings hash ({Q}:gcfg)   KEYS[2] ring of groups ({Q}:gring)
-- KEYS[3] the group's ready list ({Q}:g:<g>)   KEYS[4] its priority zset ({Q}:gp:<g>)
-- KEYS[5] the group's rate state ({Q}:gt:<g>)
-- ARGV[1] group   ARGV[2] what: 'pause', 'resume' or 'limit'
-- for 'limit': ARGV[3] concurrency ('' = none, '*' = keep the current value)
--              ARGV[4] rate '<interval us> <burst>' ('' = none, '*' = keep the current value)
-- Returns 1.
-- pause: the group leaves the ring (pop never looks at it; its jobs stay queued, intact).
-- resume: it comes back at the ring's tail when it has ready jobs; resume also gives a
-- group another try after pop took it out of the ring for garbage in its structures.
-- Run twice: each is a plain write of the same values; nothing counts up.
local g, what = ARGV[1], ARGV[2]
local function settled(key, value)
  if value == '*' then return end
  if value == '' then redis.call('HDEL', KEYS[1], key) else redis.call('HSET', KEYS[1], key, value) end
end
if what == 'pause' then
  redis.call('HSET', KEYS[1], 'p:' .. g, 1)
  redis.call('ZREM', KEYS[2], g)
elseif what == 'resume' then
  redis.call('HDEL', KEYS[1], 'p:' .. g)
  local ok, has = pcall(function()
    return redis.call('LLEN', KEYS[3]) > 0 or redis.call('ZCARD', KEYS[4]) > 0
  end)
  if (has or not ok) and not redis.call('ZSCORE', KEYS[2], g) then
    local tail = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[2], (tonumber(tail[2]) or 0) + 1, g)
  end
elseif what == 'limit' then
  settled('c:' .. g, ARGV[3])
  if ARGV[4] ~= '*' and ARGV[4] ~= redis.call('HGET', KEYS[1], 'r:' .. g) then
    redis.call('DEL', KEYS[5])
  end
  settled('r:' .. g, ARGV[4])
else
  return redis.error_reply('group_admin: unknown change ' .. what)
end
return 1
