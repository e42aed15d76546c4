-- pop: promote due delayed jobs, recover expired reservations, then reserve up to N jobs.
-- KEYS[1] ready list        KEYS[2] delayed zset      KEYS[3] reserved zset
-- KEYS[4] notify list       KEYS[5] jobs hash         KEYS[6] attempts hash
-- KEYS[7] failed zset       KEYS[8] failed info hash  KEYS[9] failed body hash
-- KEYS[10] reservation token counter ({prefix}:queue:{Q}:tokens)
-- KEYS[11] this worker's pop receipt ({prefix}:queue:{Q}:rcpt:pop:<worker>)
-- ARGV[1] max jobs to reserve   ARGV[2] lease (retry_after) in ms
-- ARGV[3] max body bytes        ARGV[4] migration chunk size   ARGV[5] queue name
-- ARGV[6] the worker's pop sequence number (it moves on only after a reply arrived)
-- Returns {now_ms, wait_ms, dropped, id1, attempts1, exceptions1, body1, token1, stalls1,
-- ...}; wait_ms is the time until the next delayed job or lease expiry is due (-1:
-- nothing scheduled).
-- Each reservation gets a fresh token (a counter, never a clock); ack, release, fail and
-- extend act only while the job's token (attempts hash, <id>:t) is still theirs.
-- A lease that expired is a stall, not an attempt: the job goes back to the ready list,
-- its stall count (<id>:s) goes up and the attempt it used is given back; the worker
-- fails it as "stalled N times" past its max_stalls.
-- Run twice (a re-sent pop whose reply was lost, or the next pop after a failed one, with
-- the same sequence number): the receipt names the jobs the first run reserved, and they
-- are handed out again, still reserved under the same tokens, rather than left to stall.
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

local function recover()
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, chunk)
  if #due > 0 then
    redis.call('ZREM', KEYS[3], unpack(due))
    redis.call('RPUSH', KEYS[1], unpack(due))
    for _, id in ipairs(due) do
      if redis.call('HEXISTS', KEYS[5], id) == 1 then
        redis.call('HINCRBY', KEYS[6], id .. ':s', 1)
        if tonumber(redis.call('HGET', KEYS[6], id) or '0') > 0 then
          redis.call('HINCRBY', KEYS[6], id, -1)
        end
      end
    end
  end
end
recover()

local function fail(id, reason, preview)
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id, id .. ':e', id .. ':t', id .. ':s')
  redis.call('ZADD', KEYS[7], now, id)
  redis.call('HSET', KEYS[8], id, cjson.encode({
    exception = reason, name = '(unreadable)', queue = ARGV[5], attempts = 0}))
  redis.call('HSET', KEYS[9], id, string.sub(preview, 1, 4096))
end

local out = {now, -1, 0}
local max, lease, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, dropped = 0, 0
local seq = ARGV[6]

local function hand_out(id, body, tok, counts)
  out[#out + 1] = id
  out[#out + 1] = tonumber(counts[1] or '0')
  out[#out + 1] = tonumber(counts[2] or '0')
  out[#out + 1] = body
  out[#out + 1] = tonumber(tok)
  out[#out + 1] = tonumber(counts[3] or '0')
  n = n + 1
end

local rcpt = redis.call('GET', KEYS[11])
if rcpt and string.sub(rcpt, 1, #seq + 1) == seq .. '|' then
  -- The same pop again: hand out what the first run reserved, if it is still ours.
  local held = {}
  for word in string.gmatch(string.sub(rcpt, #seq + 2), '%S+') do held[#held + 1] = word end
  for i = 1, #held - 1, 2 do
    local id, tok = held[i], held[i + 1]
    local body = redis.call('HGET', KEYS[5], id)
    if body and redis.call('HGET', KEYS[6], id .. ':t') == tok
      and redis.call('ZSCORE', KEYS[3], id) then
      hand_out(id, body, tok, redis.call('HMGET', KEYS[6], id, id .. ':e', id .. ':s'))
    end
  end
  max = 0
end

-- Tokens: one read of the counter now and one write after the loop, not one INCR a job.
local got = {}
local last = tonumber(redis.call('GET', KEYS[10]) or '0')
while n < max do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local body = redis.call('HGET', KEYS[5], id)
  if not body then
    if #id == 32 and string.match(id, '^%x+$') then
      -- A stale copy of a job that already finished: nothing to run.
      dropped = dropped + 1
    else
      -- Not a job id: a raw payload someone pushed. Keep it for inspection.
      local fid = 'raw-' .. now .. '-' .. redis.call('HINCRBY', KEYS[8], '_seq', 1)
      fail(fid, 'malformed queue entry: not a job id', id)
    end
  elseif redis.call('ZSCORE', KEYS[3], id) then
    -- Duplicate id of a job being run right now: that run covers it.
    dropped = dropped + 1
  elseif #body > max_bytes then
    fail(id, 'payload too large: ' .. #body .. ' bytes', body)
  elseif not pcall(cjson.decode, body) then
    fail(id, 'malformed payload: not JSON', body)
  else
    redis.call('ZADD', KEYS[3], now + lease, id)
    -- One read and one write of the counters (attempts, exceptions, stalls, token).
    local counts = redis.call('HMGET', KEYS[6], id, id .. ':e', id .. ':s')
    counts[1] = tonumber(counts[1] or '0') + 1
    last = last + 1
    redis.call('HSET', KEYS[6], id, counts[1], id .. ':t', last)
    got[#got + 1] = id
    got[#got + 1] = last
    hand_out(id, body, last, counts)
  end
end
if #got > 0 then
  redis.call('SET', KEYS[10], last)
  redis.call('SET', KEYS[11], seq .. '|' .. table.concat(got, ' '), 'PX', lease)
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
