-- throttle: count exceptions of a job key in a decaying window (ThrottlesExceptions).
-- KEYS[1] counter ({prefix}:throttle:{<key>})
-- ARGV[1] 'check' | 'hit' | 'clear'   ARGV[2] max exceptions   ARGV[3] decay ms
-- Returns for 'check': 0 when the job may run, else ms until the window decays;
-- for 'hit': the exception count in the window; for 'clear': 0.
local op = ARGV[1]
-- A counter written by hand (not an integer) would make INCR or the compare
-- below raise for every job under this key: start it afresh.
local raw = redis.call('GET', KEYS[1])
if raw and (#raw > 15 or not string.match(raw, '^%d+$')) then redis.call('DEL', KEYS[1]) end
if op == 'clear' then
  redis.call('DEL', KEYS[1])
  return 0
elseif op == 'hit' then
  local n = redis.call('INCR', KEYS[1])
  if n == 1 or redis.call('PTTL', KEYS[1]) < 0 then
    redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[3]))
  end
  return n
end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if n < tonumber(ARGV[2]) then return 0 end
local ttl = redis.call('PTTL', KEYS[1])
if ttl < 1 then return 1 end
return ttl
