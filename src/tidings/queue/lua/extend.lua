-- extend: renew the leases of jobs still running.
-- KEYS[1] reserved zset
-- ARGV[1] lease in ms   ARGV[2..] job ids
-- Returns the ids whose reservation was already gone (lease lost).
-- ZREM before ZADD: at maxmemory (noeviction) Redis refuses a script whose *first* write
-- may grow memory (ZADD) but lets it finish once it has written; ZREM never grows
-- memory, so leases are still renewed while the queue is full.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
