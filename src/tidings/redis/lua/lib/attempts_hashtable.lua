-- Shared by pop and every script that deletes a job's fields from a queue's attempts
-- hash (prepended by tidings.redis.scripts). Redis keeps a hash of up to 128 fields of
-- up to 64 bytes as a listpack, which it scans from the start for every field named: with
-- a worker's jobs in flight (a counter and a token each) those scans were a third of
-- Redis's time per job. pop writes this one field beside its reservations, its value
-- longer than 64 bytes, so Redis keeps the hash in its hashtable encoding (one lookup a
-- field) for as long as the key lives; a script that leaves it the only field deletes the
-- key, so an emptied queue still leaves no key behind. Its name starts with a space: no
-- job id does (pop's valid_id), so no job's field can be it.
local HT_FIELD = ' hashtable'
local HT_VALUE = 'kept so that Redis stores this hash as a hashtable: one lookup a field, never a scan'
local function attempts_tidy(key)
  if redis.call('HLEN', key) == 1 and redis.call('HEXISTS', key, HT_FIELD) == 1 then
    redis.call('DEL', key)
  end
end
