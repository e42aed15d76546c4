-- unlock: delete a lock only while it is still held by the given owner.
-- KEYS[1] lock key
-- ARGV[1] owner (a job id or worker token)
-- Returns 1 when deleted, 0 when the lock was gone or held by someone else.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
