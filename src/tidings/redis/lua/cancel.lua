-- cancel: the operator's cancel of one job (app.cancel, `notify-worker cancel`).
-- KEYS[1] ready list   KEYS[2] delayed zset   KEYS[3] reserved zset   KEYS[4] notify list
-- KEYS[5] jobs hash    KEYS[6] attempts hash  KEYS[7] done zset       KEYS[8] failed zset
-- KEYS[9] cancelled zset
-- ARGV[1] job id   ARGV[2] the workers' cancel channel ({prefix}:cancels)
-- Returns 'done' / 'failed' / 'cancelled' (finished already: nothing changed), 'missing'
-- (no such job on this queue), 'pending' (waiting or delayed: it will never run),
-- 'running' (reserved: its worker is told on the channel; an async handler is
-- cancelled, a sync one sees self.cancelled), 'failing' (its run failed and its worker
-- is recording the failure: too late, nothing changed; see extend.lua's failing mark).
-- The job is marked (id:c beside it); a marked job is handed out by pop as cancelled and
-- settled by a worker without running (its batch counts it, its chain stops), so a
-- canceller that dies after this script leaves nothing half-done. A delayed job is made
-- ready now and a waiting one is copied to the head of the list, so that is soon; the
-- copy left behind is dropped by pop as a stale copy.
-- Run twice: the mark is set again, the job is at the head again; nothing else changes.
local id = ARGV[1]
if redis.call('ZSCORE', KEYS[7], id) then return 'done' end
if redis.call('ZSCORE', KEYS[8], id) then return 'failed' end
if redis.call('ZSCORE', KEYS[9], id) then return 'cancelled' end
if redis.call('HEXISTS', KEYS[5], id) == 0 then return 'missing' end
local held = redis.call('HMGET', KEYS[6], id .. ':t', id .. ':f')
if held[1] and held[1] == held[2] then return 'failing' end
local t = redis.call('TIME')
redis.call('HSET', KEYS[6], id .. ':c', t[1])
if redis.call('ZSCORE', KEYS[3], id) then
  redis.call('PUBLISH', ARGV[2], id)
  return 'running'
end
redis.call('ZREM', KEYS[2], id)
redis.call('LPUSH', KEYS[1], id)
if redis.call('LLEN', KEYS[4]) < 64 then redis.call('RPUSH', KEYS[4], '1') end
return 'pending'
