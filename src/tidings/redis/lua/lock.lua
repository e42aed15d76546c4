-- lock: take or renew a lock with an expiry; re-entrant for the same owner.
-- KEYS[1] lock key
-- ARGV[1] owner (a job id or worker token)   ARGV[2] expiry ms
-- Returns 1 when the owner holds the lock now, else the remaining ms of the holder's
-- lock as a negative number (-1 when it has no expiry).
local cur = redis.call('GET', KEYS[1])
if cur == false or cur == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then return -1 end
return -ttl
