-- forget: delete failed records; with ARGV[1] = 'prune', those failed before ARGV[2] ms.
-- KEYS[1] failed zset   KEYS[2] failed info hash   KEYS[3] failed body hash
-- ARGV[1] 'ids' or 'prune'   ARGV[2..] ids, or the cutoff (ms) and a chunk size
-- Returns the number of records deleted (prune: at most one chunk; call again until 0).
local ids
if ARGV[1] == 'prune' then
  ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, tonumber(ARGV[3]))
else
  ids = {}
  for i = 2, #ARGV do ids[#ids + 1] = ARGV[i] end
end
local n = 0
for _, id in ipairs(ids) do
  n = n + redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id, id .. ':g')
  redis.call('HDEL', KEYS[3], id)
end
return n
