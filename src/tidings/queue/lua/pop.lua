-- pop: promote due delayed jobs, recover expired reservations, then reserve up to N jobs.
-- KEYS[1] ready list        KEYS[2] delayed zset      KEYS[3] reserved zset
-- KEYS[4] notify list       KEYS[5] jobs hash         KEYS[6] attempts hash
-- KEYS[7] failed zset       KEYS[8] failed info hash  KEYS[9] failed body hash
-- KEYS[10] done zset (ids of finished jobs: a copy put back is a replay, dropped)
-- ARGV[1] max jobs to reserve   ARGV[2] lease (retry_after) in ms
-- ARGV[3] max body bytes        ARGV[4] migration chunk size   ARGV[5] queue name
-- Returns {now_ms, wait_ms, dropped, id1, attempts1, exceptions1, body1, ...}; wait_ms is
-- the time until the next delayed job or lease expiry is due (-1: nothing scheduled).
-- Bodies are never decoded and re-encoded here: cjson would rewrite them.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local chunk = tonumber(ARGV[4])

-- Bounded chunks: unpack() of more than ~8k values fails, and a script must stay short.
local function migrate(from)
  local due = redis.call('ZRANGEBYSCORE', from, '-inf', now, 'LIMIT', 0, chunk)
  if #due > 0 then
    redis.call('ZREM', from, unpack(due))
    redis.call('RPUSH', KEYS[1], unpack(due))
  end
end
migrate(KEYS[2])
migrate(KEYS[3])

local function fail(id, reason, preview)
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id, id .. ':e')
  redis.call('ZADD', KEYS[7], now, id)
  redis.call('HSET', KEYS[8], id, cjson.encode({
    exception = reason, name = '(unreadable)', queue = ARGV[5], attempts = 0}))
  redis.call('HSET', KEYS[9], id, string.sub(preview, 1, 4096))
end

-- Hostile input (issue 12): anything read from Redis is checked before the first write
-- for its job, so a malformed entry fails (or drops) that one job and never raises
-- half-way through the pop, which would leave the jobs reserved before it stranded.
local function valid_id(id)
  -- Job ids are short printable ASCII (32 hex chars in practice); anything else
  -- (control bytes, invalid UTF-8) would break the worker that decodes it.
  return #id > 0 and #id <= 128 and not string.find(id, '[^!-~]')
end
local function counter(v)
  -- A counter beside a job: absent is 0; anything but a plain integer is corrupt (nil).
  if not v then return 0 end
  if #v > 15 or not string.match(v, '^%-?%d+$') then return nil end
  return tonumber(v)
end
local function raw_id()
  -- The sequence is data too: a hand-written one would make HINCRBY raise.
  if not counter(redis.call('HGET', KEYS[8], '_seq')) then redis.call('HDEL', KEYS[8], '_seq') end
  return 'raw-' .. now .. '-' .. redis.call('HINCRBY', KEYS[8], '_seq', 1)
end

local out = {now, -1, 0}
local max, lease, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, dropped = 0, 0
while n < max do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local body = redis.call('HGET', KEYS[5], id)
  local attempts0, exceptions0 = 0, 0
  if body and valid_id(id) then
    local c = redis.call('HMGET', KEYS[6], id, id .. ':e')
    attempts0, exceptions0 = counter(c[1]), counter(c[2])
  end
  if not valid_id(id) then
    -- Not a usable job id: keep what it pointed to (or the id itself) for inspection.
    if body then
      redis.call('HDEL', KEYS[5], id)
      redis.call('HDEL', KEYS[6], id, id .. ':e')
    end
    fail(raw_id(), 'malformed queue entry: job id is not printable ASCII', body or id)
  elseif not body then
    if #id == 32 and string.match(id, '^%x+$') then
      -- A stale copy of a job that already finished: nothing to run.
      dropped = dropped + 1
    else
      -- Not a job id: a raw payload someone pushed. Keep it for inspection.
      fail(raw_id(), 'malformed queue entry: not a job id', id)
    end
  elseif redis.call('ZSCORE', KEYS[3], id) then
    -- Duplicate id of a job being run right now: that run covers it.
    dropped = dropped + 1
  elseif redis.call('ZSCORE', KEYS[10], id) or redis.call('ZSCORE', KEYS[7], id) then
    -- A finished (or failed) job put back: a replay of a copied envelope. Drop it.
    redis.call('HDEL', KEYS[5], id)
    redis.call('HDEL', KEYS[6], id, id .. ':e')
    dropped = dropped + 1
  elseif not attempts0 or not exceptions0 then
    fail(id, 'corrupt attempts counter beside the job (not an integer); ' ..
      '`notify-worker failed retry` runs it again with fresh counters', body)
  elseif #body > max_bytes then
    fail(id, 'payload too large: ' .. #body .. ' bytes', body)
  elseif not pcall(cjson.decode, body) then
    fail(id, 'malformed payload: not JSON', body)
  else
    redis.call('ZADD', KEYS[3], now + lease, id)
    local attempts = redis.call('HINCRBY', KEYS[6], id, 1)
    out[#out + 1] = id
    out[#out + 1] = attempts
    out[#out + 1] = exceptions0
    out[#out + 1] = body
    n = n + 1
  end
end
out[3] = dropped

if redis.call('LLEN', KEYS[1]) == 0 then
  -- Nothing left to wake anyone for: stale tokens would only cause empty pops.
  redis.call('DEL', KEYS[4])
  local wait = -1
  for _, key in ipairs({KEYS[2], KEYS[3]}) do
    local head = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
    if head[2] then
      local w = math.max(0, tonumber(head[2]) - now)
      if wait < 0 or w < wait then wait = w end
    end
  end
  out[2] = wait
else
  out[2] = 0
end
return out
