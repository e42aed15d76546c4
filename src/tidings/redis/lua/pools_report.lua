-- A pool supervisor's report of itself, renewed every tick: its host record lives one
-- lease, so a host that stops reporting (dead, or cut off) drops out within one lease.
-- KEYS[1] hosts zset (host id -> last report, Redis clock ms)  KEYS[2] this host's record
-- ARGV[1] host id  ARGV[2] lease (ms)  ARGV[3] the report (JSON)
-- Reply: the Redis clock (ms). Safe to run twice: the same record and score again.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[3], 'PX', lease)
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - lease)
redis.call('PEXPIRE', KEYS[1], lease * 4)
return now
