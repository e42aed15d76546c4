-- djtask_record: write the record of a Django task beside its job
-- (tidings.contrib.django.tasks): a failed attempt, a final failure or a cancel. A task
-- that succeeds at once never has one (its outcome is the job's stored result).
-- KEYS[1] the record hash ({prefix}:djtask:{<id>})   KEYS[2] its worker-id list (…:w)
-- KEYS[3] its error list (…:e)
-- ARGV[1] how long the record is kept (ms)
-- ARGV[2] this write's token (a re-sent write carries the same one)
-- ARGV[3] a worker id to append ('' = none)   ARGV[4] an error (JSON) to append ('' = none)
-- ARGV[5] started_at, set only where unset ('' = none)
-- ARGV[6] '1' = the fields below are set only where unset (a cancel), else overwritten
-- ARGV[7..] field, value, field, value, ... on the hash
-- Returns 1, or 0 when this token's write was applied already.
-- Run twice: the hash keeps the token of its last write (field 'rcpt'); a write whose
-- token it holds changes nothing. A task's writes come one at a time (an attempt ends
-- before the next starts), so the last token is enough to know a re-sent one.
if redis.call('HGET', KEYS[1], 'rcpt') == ARGV[2] then return 0 end
if ARGV[3] ~= '' then redis.call('RPUSH', KEYS[2], ARGV[3]) end
if ARGV[4] ~= '' then redis.call('RPUSH', KEYS[3], ARGV[4]) end
if ARGV[5] ~= '' then redis.call('HSETNX', KEYS[1], 'started_at', ARGV[5]) end
for i = 7, #ARGV, 2 do
  if ARGV[6] == '1' then
    redis.call('HSETNX', KEYS[1], ARGV[i], ARGV[i + 1])
  else
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
  end
end
redis.call('HSET', KEYS[1], 'rcpt', ARGV[2])
for i = 1, 3 do
  if redis.call('EXISTS', KEYS[i]) == 1 then redis.call('PEXPIRE', KEYS[i], ARGV[1]) end
end
return 1
