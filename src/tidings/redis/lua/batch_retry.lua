-- batch_retry: a finally failed batch job is about to go back to its queue (`failed
-- retry`): count it as pending again, and let it through the batch gate.
-- KEYS[1] batch hash   KEYS[2] finished ids set   KEYS[3] failed ids set
-- KEYS[4] retried ids set
-- ARGV[1] job id   ARGV[2] how long the retried set is kept when the id sets had expired (ms)
-- Returns 1: counted back as pending (failed - 1, pending + 1; a finished batch is open
-- again); 2: the batch's id sets had expired (a week after it finished): the job runs,
-- uncounted; 0: nothing to do (not a failed member, or retried already: a re-sent call
-- changes nothing); -1: no such batch (the job runs as a plain job).
-- The callbacks keep their once-only ids: a batch finishing a second time does not run
-- `finally` (or `catch`) again; `then` runs if it never ran and no failure is left.
local id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('SISMEMBER', KEYS[3], id) == 1 then
  redis.call('SREM', KEYS[3], id)
  redis.call('SREM', KEYS[2], id)
  redis.call('SADD', KEYS[4], id)
  redis.call('HINCRBY', KEYS[1], 'failed', -1)
  redis.call('HINCRBY', KEYS[1], 'pending', 1)
  redis.call('HINCRBY', KEYS[1], 'retried', 1)
  if redis.call('HGET', KEYS[1], 'finished_at') ~= '0' then
    redis.call('HSET', KEYS[1], 'finished_at', 0)
    redis.call('HDEL', KEYS[1], 'finisher', 'then_fired')
  end
  -- open again: the id sets must not expire under it
  redis.call('PERSIST', KEYS[2])
  redis.call('PERSIST', KEYS[3])
  redis.call('PERSIST', KEYS[4])
  return 1
end
if redis.call('SISMEMBER', KEYS[4], id) == 1 then return 0 end
if redis.call('EXISTS', KEYS[2]) == 0 and redis.call('HGET', KEYS[1], 'finished_at') ~= '0' then
  redis.call('SADD', KEYS[4], id)
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[2]))
  return 2
end
return 0
