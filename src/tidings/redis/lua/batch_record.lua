-- batch_record: count one batch job as finished (succeeded or finally failed), once.
-- KEYS[1] batch hash   KEYS[2] finished ids set   KEYS[3] failed ids set
-- KEYS[4] retried ids set (jobs `failed retry` sent back, see lua/batch_retry.lua)
-- ARGV[1] job id   ARGV[2] 'ok' | 'fail' | 'cancel' (the job was cancelled: counted in
-- 'cancelled'; `then` does not fire for a batch with a cancelled job, `finally` does)   ARGV[3] how long the id sets are kept after
-- the batch finished (ms)
-- Returns {code, kind1, queue1, envelope1, ...}: code 1 = counted, 0 = counted before (a
-- re-delivered job) or the batch had finished, -1 = no such batch. The callbacks listed
-- are the ones this job fires; deciding them here, in the same atomic step that counts the
-- job, is what makes each fire once however many workers finish jobs at the same time. A
-- job counted before gets back the callbacks it fired then (its worker may have died
-- before pushing them; the push refuses ids already pushed).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1} end
-- Counters written by hand (not integers) would make HINCRBY raise after the
-- SADD below, half-way through; treat such a batch as gone (the job itself succeeds).
for _, field in ipairs({'pending', 'processed', 'failed'}) do
  local v = redis.call('HGET', KEYS[1], field)
  if v and (#v > 15 or not string.match(v, '^%-?%d+$')) then return {-1} end
end
local out = {1}
local function fire(kind)
  local q = redis.call('HGET', KEYS[1], 'cb:' .. kind .. ':q')
  if q then
    out[#out + 1] = kind
    out[#out + 1] = q
    out[#out + 1] = redis.call('HGET', KEYS[1], 'cb:' .. kind .. ':b')
  end
end
local finished = redis.call('HGET', KEYS[1], 'finished_at') ~= '0'
if finished or redis.call('SADD', KEYS[2], id) == 0 then
  out[1] = 0
  if KEYS[4] and redis.call('SREM', KEYS[4], id) == 1 then
    -- a retried job of a batch whose id sets had expired: ran uncounted, fires nothing
    return out
  end
  if redis.call('HGET', KEYS[1], 'catch_by') == id then fire('catch') end
  if redis.call('HGET', KEYS[1], 'finisher') == id then
    if redis.call('HGET', KEYS[1], 'then_fired') == '1' then fire('then') end
    fire('finally')
  end
  return out
end
if KEYS[4] then redis.call('SREM', KEYS[4], id) end
local pending = redis.call('HINCRBY', KEYS[1], 'pending', -1)
if ARGV[2] == 'ok' then
  redis.call('HINCRBY', KEYS[1], 'processed', 1)
elseif ARGV[2] == 'cancel' then
  redis.call('HINCRBY', KEYS[1], 'cancelled', 1)
else
  redis.call('SADD', KEYS[3], id)
  -- catch_by: `catch` is decided once in the batch's life (a retried job failing again
  -- after the count went back to 0 does not fire it twice)
  if redis.call('HINCRBY', KEYS[1], 'failed', 1) == 1 and not redis.call('HGET', KEYS[1], 'catch_by') then
    redis.call('HSET', KEYS[1], 'catch_by', id)
    fire('catch')
    if redis.call('HGET', KEYS[1], 'allow_failures') ~= '1'
      and redis.call('HGET', KEYS[1], 'cancelled_at') == '0' then
      redis.call('HSET', KEYS[1], 'cancelled_at', now)
    end
  end
end
if pending <= 0 then
  redis.call('HSET', KEYS[1], 'finished_at', now, 'finisher', id)
  if redis.call('HGET', KEYS[1], 'failed') == '0'
    and redis.call('HGET', KEYS[1], 'cancelled_at') == '0'
    and tonumber(redis.call('HGET', KEYS[1], 'cancelled') or '0') == 0 then
    redis.call('HSET', KEYS[1], 'then_fired', 1)
    fire('then')
  end
  fire('finally')
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
  redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[3]))
  if KEYS[4] then redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[3])) end
end
return out
