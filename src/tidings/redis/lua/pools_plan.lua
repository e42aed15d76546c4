-- The leader publishes a plan (processes per pool per host), fenced by its lease, and
-- logs the decision and a sample of processes per pool for the dashboard.
-- KEYS[1] leader key  KEYS[2] plan  KEYS[3] plan seq  KEYS[4] decisions list
-- KEYS[5] samples list
-- ARGV[1] host id  ARGV[2] seq  ARGV[3] plan (JSON)  ARGV[4] sample (JSON, '' when none)
-- ARGV[5] decision (JSON, '' when none)  ARGV[6] entries kept per list  ARGV[7] ttl (s)
-- Reply: 1 written (or already written: a re-sent call), 0 not the leader.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if redis.call('GET', KEYS[3]) == ARGV[1] .. ':' .. ARGV[2] then
  return 1  -- this exact plan was written already: a re-send logs nothing twice
end
local ttl = tonumber(ARGV[7])
local keep = tonumber(ARGV[6])
redis.call('SET', KEYS[2], ARGV[3], 'EX', ttl)
redis.call('SET', KEYS[3], ARGV[1] .. ':' .. ARGV[2], 'EX', ttl)
if ARGV[4] ~= '' then
  redis.call('LPUSH', KEYS[5], ARGV[4])
  redis.call('LTRIM', KEYS[5], 0, keep - 1)
  redis.call('EXPIRE', KEYS[5], ttl)
end
if ARGV[5] ~= '' then
  redis.call('LPUSH', KEYS[4], ARGV[5])
  redis.call('LTRIM', KEYS[4], 0, keep - 1)
  redis.call('EXPIRE', KEYS[4], ttl)
end
return 1
