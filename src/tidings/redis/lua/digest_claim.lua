-- digest_claim: the flush job of window <id> takes the window's items.
-- KEYS[1] items list   KEYS[2] window   KEYS[3] claimed list
-- ({prefix}:queue:{Q}:digest:<name>:claimed:<id>)
-- ARGV[1] window id   ARGV[2] how long a claimed digest is kept undelivered (ms)
-- Returns the claimed list's items, oldest first (claimed now, or by an earlier run that
-- did not finish: the digest is sent again, whole), or an empty list when there is
-- nothing to send (an earlier run delivered it and deleted the claimed list).
-- The window closes here: the next item opens a new one with a new flush job. A window
-- whose marker expired (its flush ran a day late) leaves its items to the next window.
if redis.call('EXISTS', KEYS[3]) == 1 then return redis.call('LRANGE', KEYS[3], 0, -1) end
if redis.call('GET', KEYS[2]) == ARGV[1] then
  redis.call('DEL', KEYS[2])
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('RENAME', KEYS[1], KEYS[3])
    redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]))
    return redis.call('LRANGE', KEYS[3], 0, -1)
  end
end
return {}
