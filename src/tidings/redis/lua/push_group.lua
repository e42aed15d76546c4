-- push_group: store job bodies of one fair group and queue their ids in that group.
-- KEYS[1] jobs hash   KEYS[2] done zset   KEYS[3] failed zset   KEYS[4] attempts hash
-- KEYS[5] notify list KEYS[6] delayed zset
-- KEYS[7] groups marker ({prefix}:queue:{Q}:gon; its existence turns groups on for pop)
-- KEYS[8] ring of groups with ready jobs ({Q}:gring, zset group -> turn)
-- KEYS[9] group settings hash ({Q}:gcfg: p:<g> paused, c:<g> concurrency, r:<g> rate)
-- KEYS[10] priority sequence ({Q}:pseq)
-- ARGV[1] group   ARGV[2] delay ms (0: ready now)   ARGV[3] priority (-100..100)
-- ARGV[4..] id1, body1, id2, body2, ...
-- Returns the number of jobs pushed.
-- A group's ready jobs: the list {Q}:g:<group> (priority 0), and the zset {Q}:gp:<group>
-- (other priorities, scored as the queue's prio zset). The group is kept beside the job
-- (id:g), so a retried, released, recovered or delayed job comes back into its group.
-- Every group key carries the queue's hash tag: one slot on Redis Cluster.
-- Run twice (a re-sent push whose reply was lost): an id that is queued, running, done or
-- failed already is not pushed again, so it lands once.
local g = ARGV[1]
local delay = tonumber(ARGV[2])
local p = tonumber(ARGV[3])
local STEP = 35184372088832
local base = string.sub(KEYS[8], 1, -7)
local now = 0
if delay > 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
if redis.call('EXISTS', KEYS[7]) == 0 then redis.call('SET', KEYS[7], 1) end
if p ~= 0 then redis.call('SETNX', KEYS[10], 0) end
local n, ready = 0, 0
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HSETNX', KEYS[1], id, ARGV[i + 1]) == 1 then
    if redis.call('ZSCORE', KEYS[2], id) or redis.call('ZSCORE', KEYS[3], id) then
      redis.call('HDEL', KEYS[1], id)
    else
      if p ~= 0 then
        redis.call('HSET', KEYS[4], id .. ':g', g, id .. ':p', p)
      else
        redis.call('HSET', KEYS[4], id .. ':g', g)
      end
      if delay > 0 then
        redis.call('ZADD', KEYS[6], now + delay, id)
      elseif p ~= 0 then
        local seq = redis.call('INCR', KEYS[10])
        redis.call('ZADD', base .. ':gp:' .. g, string.format('%.0f', (100 - p) * STEP + seq), id)
        ready = ready + 1
      else
        redis.call('RPUSH', base .. ':g:' .. g, id)
        ready = ready + 1
      end
      n = n + 1
    end
  end
end
-- The queue's count of grouped ready jobs ({Q}:gready), kept beside every move of an id
-- into or out of a group's ready keys, so `monitor` reads one key however many groups.
-- A count written by hand (garbage) is dropped, never stops the push.
if ready > 0 and not pcall(redis.call, 'INCRBY', base .. ':gready', ready) then
  redis.call('DEL', base .. ':gready')
end
if ready > 0 and not redis.call('HGET', KEYS[9], 'p:' .. g)
  and not redis.call('ZSCORE', KEYS[8], g) then
  -- Into the ring at its tail: the group waits one turn of every other active group.
  local tail = redis.call('ZRANGE', KEYS[8], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[8], (tonumber(tail[2]) or 0) + 1, g)
end
local have = redis.call('LLEN', KEYS[5])
for _ = 1, math.min(math.max(ready, delay > 0 and n > 0 and 1 or 0), 64 - have) do
  redis.call('RPUSH', KEYS[5], '1')
end
return n
