-- progress: keep a running job's last reported progress, while its token matches.
-- KEYS[1] attempts hash   KEYS[2] the job's progress key ({prefix}:queue:{Q}:progress:<id>)
-- ARGV[1] job id   ARGV[2] the reservation token   ARGV[3] JSON {done, total, note, at}
-- ARGV[4] how long it is kept (ms)
-- Returns 1, or 0 when the reservation was lost (a stale holder writes nothing).
-- Run twice: the same value is set again.
if redis.call('HGET', KEYS[1], ARGV[1] .. ':t') ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'PX', tonumber(ARGV[4]))
return 1
