-- Shared by pop and every script that takes a job out of a queue's reserved zset
-- (prepended by tidings.redis.scripts). Redis keeps a zset of up to 128 members of up to
-- 64 bytes as a listpack, which it scans from the start (and rewrites) for every member
-- added, removed or looked up: with a worker's jobs in flight those scans were ~15k of
-- Redis's ~120k instructions per job. pop adds this one member beside its reservations,
-- its name longer than 64 bytes, so Redis keeps the zset in its skiplist encoding (a dict
-- lookup a member) for as long as the key lives. Its score is +inf: never a due lease
-- (recover reads -inf..now), never the next lease to wait for (pop skips an infinite
-- score), and counts of reserved jobs leave it out (ZCOUNT -inf (+inf, tidings.moves.
-- queues). A script that leaves it the only member deletes it (and so the key): an
-- emptied queue still leaves no key behind. Its name starts with a space: no job id does
-- (pop's valid_id), so no job can be it, and a ZSCORE of a job id never finds it.
local RESERVED_MARK = ' skiplist: kept so that Redis stores this zset as a skiplist, one lookup a member'
local function reserved_tidy(key)
  if redis.call('ZCARD', key) == 1 then redis.call('ZREM', key, RESERVED_MARK) end
end
