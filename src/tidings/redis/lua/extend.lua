-- extend: renew the leases of jobs still running, each only while its token matches.
-- KEYS[1] reserved zset   KEYS[2] attempts hash
-- ARGV[1] lease in ms   ARGV[2] 'failing' when this check opens a job's failure, else ''
-- ARGV[3..] id1, token1, id2, token2, ...
-- Returns the ids whose reservation was lost (the token no longer matches: the job was
-- handed out again, or settled); their new holder's lease is left alone. A renewed job
-- that `app.cancel` marked meanwhile (id:c) is listed as 'c:<id>': the worker cancels it
-- even if it missed the message on the cancel channel.
-- The check that opens a failure ('failing') also marks the job as failing (id:f, its
-- token as the value) unless it is marked cancelled: from then on cancel.lua answers
-- 'failing' (too late: failed() and the workflow moves run next, then fail.lua), so a
-- cancel never answers 'cancelling' for a job that then ends failed. The mark names its
-- token: a stale one (its holder lost the job) means nothing and pop deletes it when it
-- hands the stalled job out again.
-- A job whose lease expired but that no one reserved again (its token still matches) is
-- reserved again: the copy that the expiry put back on the ready list is then dropped by
-- pop as a duplicate of a job being run.
-- Run twice: the lease ends at now + lease either way; the failing mark is set again.
-- ZREM before ZADD: at maxmemory (noeviction) Redis refuses a script whose *first* write
-- may grow memory (ZADD) but lets it finish once it has written; ZREM never grows
-- memory, so leases are still renewed while the queue is full.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = {}
local failing = ARGV[2] == 'failing'
for i = 3, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[2], id .. ':t') == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], id)
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), id)
    if redis.call('HEXISTS', KEYS[2], id .. ':c') == 1 then
      lost[#lost + 1] = 'c:' .. id
    elseif failing then
      redis.call('HSET', KEYS[2], id .. ':f', ARGV[i + 1])
    end
  else
    lost[#lost + 1] = id
  end
end
return lost
