-- Take or renew the pools' leader lease. One leader decides for every host; it holds the
-- lease while it renews it, and another host takes it once it lapses (one lease).
-- KEYS[1] leader key  ARGV[1] host id  ARGV[2] lease (ms)
-- Reply: 1 when this host leads (taken or renewed), 0 when another does.
-- Safe to run twice: a second call by the holder only renews.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
  return 1
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
  return 1
end
return 0
