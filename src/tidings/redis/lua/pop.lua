-- pop: promote due delayed jobs, recover expired reservations, then reserve up to N jobs.
-- KEYS[1] ready list        KEYS[2] delayed zset      KEYS[3] reserved zset
-- KEYS[4] notify list       KEYS[5] jobs hash         KEYS[6] attempts hash
-- KEYS[7] failed zset       KEYS[8] failed info hash  KEYS[9] failed body hash
-- KEYS[10] reservation token counter ({prefix}:queue:{Q}:tokens)
-- KEYS[11] this worker's pop receipt ({prefix}:queue:{Q}:rcpt:pop:<worker>)
-- KEYS[12] done zset (ids of finished jobs: a copy put back is a replay, dropped)
-- KEYS[13] priority zset ({prefix}:queue:{Q}:prio)   KEYS[14] priority sequence (pseq)
-- KEYS[15] groups marker (gon)   KEYS[16] ring of groups (gring)   KEYS[17] group settings
-- ARGV[1] max jobs to reserve   ARGV[2] lease (retry_after) in ms
-- ARGV[3] max body bytes        ARGV[4] migration chunk size   ARGV[5] queue name
-- ARGV[6] the worker's pop sequence number (it moves on only after a reply arrived)
-- Returns {now_ms, wait_ms, dropped, id1, attempts1, body1, token1, more1, ...}; wait_ms
-- is the time until the next delayed job or lease expiry is due (-1: nothing scheduled);
-- more is 0 for a job with no exceptions, no stalls and no cancel mark (the usual job: one
-- reply entry, not three), else "<exceptions> <stalls> <cancelled>", cancelled being 1 for
-- a job `app.cancel` marked (id:c): the worker settles it as cancelled without running it.
-- Priorities: a queue that never saw one (no pseq key) pops its ready list and nothing
-- else. Otherwise jobs of priority > 0 (prio zset, lowest score first) come before the
-- list (priority 0), and jobs of priority < 0 after it; jobs coming back (due delayed,
-- expired leases) go where their priority (id:p) says.
-- Fair groups: a queue that never saw a grouped job (no gon key) pops as above. Otherwise
-- ready jobs are taken round-robin over the ring (a zset group -> turn, lowest first):
-- one job of the head group, which then goes to the tail while it has ready jobs left.
-- Ungrouped jobs take their turns as one more member of the ring (''). A paused group
-- leaves the ring (resume or its next push puts it back); a group at its concurrency
-- (its running set {Q}:gr:<g>, ids checked against the reserved zset, so a slot held by
-- a dead worker frees when its lease ends) or rate (GCRA state {Q}:gt:<g>) goes to the
-- tail, and its jobs stay queued. Garbage in one group's structures (a wrong type, a
-- setting that is not a number) takes that group out of the ring and is reported after
-- the jobs as an entry "\1<group>\1<reason>"; the other groups go on.
-- Each reservation gets a fresh token (a counter, never a clock); ack, release, fail and
-- extend act only while the job's token (attempts hash, <id>:t) is still theirs.
-- A lease that expired is a stall, not an attempt: the job goes back to the ready list,
-- its stall count (<id>:s) goes up and the attempt it used is given back; the worker
-- fails it as "stalled N times" past its max_stalls.
-- Run twice (a re-sent pop whose reply was lost, or the next pop after a failed one, with
-- the same sequence number): the receipt names the jobs the first run reserved, and they
-- are handed out again, still reserved under the same tokens, rather than left to stall.
-- A job that stalled before (a suspect) is reserved only as the first of a pop, and ends
-- it: the worker runs it alone (see tidings.worker.fetch).
-- The reserved zset holds one member that is no job (RESERVED_MARK, score +inf:
-- lua/lib/reserved_skiplist.lua, prepended) so that Redis keeps it as a skiplist.
-- Bodies are never decoded here (cjson would rewrite them, and costs Redis time per job).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Numbers go to redis.call as strings (Redis formats a Lua number with printf per call).
local nows = string.format('%d', now)
-- Most queues have neither priorities nor groups: one call tells.
local marks = redis.call('EXISTS', KEYS[14], KEYS[15])
local prio_on = marks > 0 and redis.call('EXISTS', KEYS[14]) == 1
-- Scores below BOUND are jobs of priority > 0 (score = (100 - priority) * 2^45 + seq).
local STEP = 35184372088832
local BOUND = 100 * STEP
local groups_on = marks > 0 and redis.call('EXISTS', KEYS[15]) == 1
local gbase = string.sub(KEYS[16], 1, -7)
local broken = {}
local function errtext(e)
  if type(e) == 'table' then return tostring(e.err or e.msg or '?') end
  return tostring(e)
end
local function report(g, why)
  broken[#broken + 1] = '\1' .. g .. '\1' .. why
end

-- The ring's tail turn (a group put there waits one turn of every other group).
local function to_tail(g)
  local tail = redis.call('ZRANGE', KEYS[16], -1, -1, 'WITHSCORES')
  redis.call('ZADD', KEYS[16], (tonumber(tail[2]) or 0) + 1, g)
end

-- The queue's count of grouped ready ids ({Q}:gready, see push_group.lua) by n; it goes
-- with the last id (an emptied queue leaves no key), and a count written by hand
-- (garbage) is dropped rather than stop the move.
local function gcount(n)
  if n == 0 then return end
  local ok, v = pcall(redis.call, 'INCRBY', gbase .. ':gready', n)
  if not ok or v <= 0 then redis.call('DEL', gbase .. ':gready') end
end

-- A job coming back (stalled, delayed, retried) whose group's structures are garbage is
-- parked in the delayed set for this long and tried again then (pop reports the group each
-- time): never on the plain list, where it would run outside its group's limits.
local PARK_MS = 5000

-- A job of group g back among its group's ready jobs (at the head: a suspect put back).
-- Every structure it touches is read first: garbage raises before any write, so the job
-- is never half in its group.
local function group_ready(id, g, p, head)
  local run, gl, gp = gbase .. ':gr:' .. g, gbase .. ':g:' .. g, gbase .. ':gp:' .. g
  redis.call('SCARD', run)
  redis.call('LLEN', gl)
  redis.call('ZCARD', gp)
  local turn = redis.call('ZSCORE', KEYS[16], g)
  local paused = redis.call('HGET', KEYS[17], 'p:' .. g)
  local prio = p ~= 0 and p >= -100 and p <= 100
  local pseq = prio and redis.call('GET', KEYS[14])
  if prio and pseq and not string.match(pseq, '^%-?%d+$') then
    error({err = 'priority sequence ' .. KEYS[14] .. ' is not an integer'})
  end
  redis.call('SREM', run, id)
  if prio then
    local seq = redis.call('INCR', KEYS[14])
    gcount(redis.call('ZADD', gp, string.format('%.0f', (100 - p) * STEP + seq), id))
  elseif head then
    redis.call('LPUSH', gl, id)
    gcount(1)
  else
    redis.call('RPUSH', gl, id)
    gcount(1)
  end
  if not turn and not paused then to_tail(g) end
end

-- Ids back to ready: the list, or the priority zset for a job with a priority.
local function to_ready(ids)
  if groups_on then
    local plain = {}
    for _, id in ipairs(ids) do
      local c = redis.call('HMGET', KEYS[6], id .. ':g', id .. ':p')
      local p = tonumber(c[2] or '0') or 0
      if c[1] then
        -- A group whose structures are garbage raises here: the error names it, and
        -- the job is parked (PARK_MS) until the group is repaired.
        local ok, err = pcall(group_ready, id, c[1], p, false)
        if not ok then
          report(c[1], errtext(err) .. '; its returning job ' .. id .. ' is parked in the delayed set (tried again every 5 s)')
          redis.call('ZADD', KEYS[2], now + PARK_MS, id)
        end
      elseif p ~= 0 and p >= -100 and p <= 100 and prio_on then
        local seq = redis.call('INCR', KEYS[14])
        redis.call('ZADD', KEYS[13], string.format('%.0f', (100 - p) * STEP + seq), id)
      else
        plain[#plain + 1] = id
      end
    end
    if #plain > 0 then redis.call('RPUSH', KEYS[1], unpack(plain)) end
    return
  end
  if not prio_on then
    redis.call('RPUSH', KEYS[1], unpack(ids))
    return
  end
  local plain = {}
  for _, id in ipairs(ids) do
    local p = tonumber(redis.call('HGET', KEYS[6], id .. ':p') or '0') or 0
    if p ~= 0 and p >= -100 and p <= 100 then
      local seq = redis.call('INCR', KEYS[14])
      redis.call('ZADD', KEYS[13], string.format('%.0f', (100 - p) * STEP + seq), id)
    else
      plain[#plain + 1] = id
    end
  end
  if #plain > 0 then redis.call('RPUSH', KEYS[1], unpack(plain)) end
end

-- Bounded chunks: unpack() of more than ~8k values fails, and a script must stay short.
local function migrate(from)
  local due = redis.call('ZRANGEBYSCORE', from, '-inf', nows, 'LIMIT', '0', ARGV[4])
  if #due > 0 then
    redis.call('ZREM', from, unpack(due))
    to_ready(due)
  end
end
migrate(KEYS[2])

-- Hostile input: anything read from Redis is checked before the first write
-- for its job, so a malformed entry fails (or drops) that one job and never raises
-- half-way through the pop, which would leave the jobs reserved before it stranded.
local function valid_id(id)
  -- Job ids are short printable ASCII (32 hex chars in practice); anything else
  -- (control bytes, invalid UTF-8) would break the worker that decodes it.
  return #id <= 128 and string.find(id, '^[!-~]+$') ~= nil
end
local function counter(v)
  -- A counter beside a job: absent is 0; anything but a plain integer is corrupt (nil).
  if not v then return 0 end
  if #v > 15 or not string.match(v, '^%-?%d+$') then return nil end
  return tonumber(v)
end
local function envelope_shaped(body)
  -- The frame every envelope has ({"s":"<22-char tag>","j":...}, or an earlier
  -- version's {"sig":"<64 hex>","body":{...}}: wire/envelope.py). Only bodies off
  -- the frame are decoded here: the worker parses every body and checks the signature
  -- over it anyway (a malformed one fails there, kept whole), and a cjson.decode of
  -- every body here cost ~3.5 us of Redis time per job.
  if string.byte(body, -1) ~= 125 then return false end
  if string.sub(body, 1, 6) == '{"s":"' then return string.sub(body, 29, 31) == '","' end
  return string.sub(body, 1, 8) == '{"sig":"' and string.sub(body, 73, 82) == '","body":{'
end
local function raw_id()
  -- The sequence is data too: a hand-written one would make HINCRBY raise.
  if not counter(redis.call('HGET', KEYS[8], '_seq')) then redis.call('HDEL', KEYS[8], '_seq') end
  return 'raw-' .. now .. '-' .. redis.call('HINCRBY', KEYS[8], '_seq', 1)
end

local function recover()
  local due = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', nows, 'LIMIT', '0', ARGV[4])
  for i = #due, 1, -1 do
    -- The skiplist mark (lua/lib/reserved_skiplist.lua) is no job: only a hand-written
    -- score brings it here; it stays (the next reservation sets +inf again).
    if due[i] == RESERVED_MARK then table.remove(due, i) end
  end
  if #due > 0 then
    redis.call('ZREM', KEYS[3], unpack(due))
    reserved_tidy(KEYS[3])
    to_ready(due)
    for _, id in ipairs(due) do
      if valid_id(id) and redis.call('HEXISTS', KEYS[5], id) == 1 then
        local c = redis.call('HMGET', KEYS[6], id, id .. ':s')
        local attempts, stalls = counter(c[1]), counter(c[2])
        -- Corrupt counters are left as they are: the pop below fails that job.
        if attempts and stalls then
          if attempts > 0 then
            redis.call('HSET', KEYS[6], id .. ':s', stalls + 1, id, attempts - 1)
          else
            redis.call('HSET', KEYS[6], id .. ':s', stalls + 1)
          end
        end
      end
    end
  end
end
recover()

local forgot = false
local function forget(id)
  forgot = true
  redis.call('HDEL', KEYS[5], id)
  redis.call('HDEL', KEYS[6], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
    id .. ':f', id .. ':g')
end

local function fail(id, reason, preview)
  forget(id)
  redis.call('ZADD', KEYS[7], now, id)
  redis.call('HSET', KEYS[8], id, cjson.encode({
    exception = reason, name = '(unreadable)', queue = ARGV[5], attempts = 0}))
  redis.call('HSET', KEYS[9], id, string.sub(preview, 1, 4096))
end

local out = {now, -1, 0}
local max, lease, max_bytes = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local n, dropped = 0, 0
local seq = ARGV[6]

-- A job's exceptions, stalls and cancel mark as one reply entry (see the header): Redis
-- spends ~800 instructions a reply entry.
local function more(exceptions, stalls, mark)
  if exceptions == 0 and stalls == 0 and not mark then return 0 end
  return string.format('%d %d %d', exceptions, stalls, mark and 1 or 0)
end

local function hand_out(id, body, tok, counts)
  local o = #out
  out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, counts[1], body, tonumber(tok)
  out[o + 5] = more(counts[2], counts[3], counts[4])
  n = n + 1
end

-- The next ready id (and its priority score, nil for the list).
local function plain_next()
  if prio_on then
    local head = redis.call('ZRANGE', KEYS[13], 0, 0, 'WITHSCORES')
    if head[1] then
      local s = tonumber(head[2])
      if s < BOUND or redis.call('LLEN', KEYS[1]) == 0 then
        redis.call('ZREM', KEYS[13], head[1])
        return head[1], s
      end
    end
  end
  return redis.call('LPOP', KEYS[1]), nil
end

local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- A group setting: absent is nil; anything but a plain non-negative integer is garbage.
local function setting(v, g, what)
  if not v then return nil end
  if #v > 15 or not string.match(v, '^%d+$') then
    error({err = 'group setting ' .. what .. ' is not an integer'})
  end
  return tonumber(v)
end

-- Take one ready id of group g, or nil with the reason it gave none ('paused', 'busy',
-- 'empty'). Only reads until the id is taken: a garbage structure raises before any write.
local function group_take(g)
  local c = redis.call('HMGET', KEYS[17], 'p:' .. g, 'c:' .. g, 'r:' .. g)
  if c[1] then return nil, 'paused' end
  local limit = setting(c[2], g, 'c:' .. g)
  local run = gbase .. ':gr:' .. g
  if limit then
    if redis.call('SCARD', run) >= limit then
      -- Slots of jobs no longer reserved (a lease ended, a move missed) come back.
      for _, id in ipairs(redis.call('SMEMBERS', run)) do
        if not redis.call('ZSCORE', KEYS[3], id) then redis.call('SREM', run, id) end
      end
      if redis.call('SCARD', run) >= limit then return nil, 'busy' end
    end
  else
    redis.call('SCARD', run)  -- its type is checked before the take
  end
  local interval, burst, tat = nil, nil, nil
  if c[3] then
    local a, b = string.match(c[3], '^(%d+) (%d+)$')
    interval, burst = tonumber(a), tonumber(b)
    if not interval or not burst or interval < 1 or burst < 1 or #c[3] > 31 then
      error({err = 'group setting r:' .. g .. ' is not "<interval us> <burst>"'})
    end
    tat = tonumber(redis.call('GET', gbase .. ':gt:' .. g) or now_us)
    if not tat or tat ~= tat or tat > now_us + interval * burst then tat = now_us end
    if tat < now_us then tat = now_us end
    if now_us < tat + interval - interval * burst then return nil, 'busy' end
  end
  local id, score = nil, nil
  local gl, gp = gbase .. ':g:' .. g, gbase .. ':gp:' .. g
  if prio_on then
    local head = redis.call('ZRANGE', gp, 0, 0, 'WITHSCORES')
    if head[1] then
      local s = tonumber(head[2])
      if s < BOUND or redis.call('LLEN', gl) == 0 then
        redis.call('ZREM', gp, head[1])
        id, score = head[1], s
      end
    end
  end
  if not id then id = redis.call('LPOP', gl) end
  if not id then return nil, 'empty' end
  gcount(-1)
  if tat then
    local new_tat = tat + interval
    redis.call('SET', gbase .. ':gt:' .. g, string.format('%d', new_tat),
      'PX', math.ceil((new_tat - now_us) / 1000) + 1)
  end
  if redis.call('LLEN', gl) > 0 or (prio_on and redis.call('EXISTS', gp) == 1) then
    to_tail(g)
  else
    redis.call('ZREM', KEYS[16], g)
  end
  return id, score
end

-- Round-robin over the ring; returns id, priority score, group (nil: ungrouped).
local SCAN = 100
local function next_id()
  if not groups_on then
    local id, score = plain_next()
    return id, score, nil
  end
  for _ = 1, SCAN do
    local head = redis.call('ZRANGE', KEYS[16], 0, 0)
    local g = head[1]
    if not g then return nil end
    if g == '' then
      local id, score = plain_next()
      if redis.call('LLEN', KEYS[1]) > 0 or (prio_on and redis.call('ZCARD', KEYS[13]) > 0) then
        to_tail('')
      else
        redis.call('ZREM', KEYS[16], '')
      end
      if id then return id, score, nil end
    else
      local ok, id, why = pcall(group_take, g)
      if not ok then
        report(g, errtext(id))
        redis.call('ZREM', KEYS[16], g)
      elseif id then
        return id, why, g
      elseif why == 'busy' then
        to_tail(g)
      else
        -- Paused (resume puts it back) or emptied: out of the ring.
        redis.call('ZREM', KEYS[16], g)
      end
    end
  end
  return nil
end
if groups_on and (redis.call('LLEN', KEYS[1]) > 0
    or (prio_on and redis.call('ZCARD', KEYS[13]) > 0))
  and not redis.call('ZSCORE', KEYS[16], '') then
  to_tail('')
end

local rcpt = redis.call('GET', KEYS[11])
if rcpt and string.sub(rcpt, 1, #seq + 1) == seq .. '|' then
  -- The same pop again: hand out what the first run reserved, if it is still ours.
  local held = {}
  for word in string.gmatch(string.sub(rcpt, #seq + 2), '%S+') do held[#held + 1] = word end
  for i = 1, #held - 1, 2 do
    local id, tok = held[i], held[i + 1]
    local body = redis.call('HGET', KEYS[5], id)
    if body and counter(tok) and redis.call('HGET', KEYS[6], id .. ':t') == tok
      and redis.call('ZSCORE', KEYS[3], id) then
      local c = redis.call('HMGET', KEYS[6], id, id .. ':e', id .. ':s', id .. ':c')
      c = {counter(c[1]), counter(c[2]), counter(c[3]), c[4]}
      -- Counters spoiled since the first run: left reserved, they stall and fail below.
      if c[1] and c[2] and c[3] then hand_out(id, body, tok, c) end
    end
  end
  max = 0
end

-- Tokens: one read of the counter now and one write after the loop, not one INCR a job.
local got = {}
-- A hand-written counter restarts from the clock, which only moves forward.
local last = counter(redis.call('GET', KEYS[10])) or now

-- Redis time per job is mostly the calls a script makes, not what they do: the ids of a
-- plain queue are taken with one LPOP, and each step is one call for all of them (one
-- HMGET of the bodies, one of the counters, one ZMSCORE a zset, one ZADD, one HSET).
-- unpack() takes at most ~8k values: a batch is at most TAKE ids (4 fields each).
local TAKE = 500
local function each(cmd, key, vals, per)
  local step = per * 1000
  for s = 1, #vals, step do
    redis.call(cmd, key, unpack(vals, s, math.min(s + step - 1, #vals)))
  end
end
-- The counter fields of each id (id, id:e, id:s, id:c), in order.
local function counter_fields(ids)
  local f = {}
  for _, id in ipairs(ids) do
    local i = #f
    f[i + 1], f[i + 2], f[i + 3], f[i + 4] = id, id .. ':e', id .. ':s', id .. ':c'
  end
  return f
end
-- Numbers go to redis.call as strings made once: Redis formats a Lua number argument
-- with printf('%.17g') on every call, which cost more than the command itself.
local lease_end = string.format('%d', now + lease)
local small = {}
local function num(x)
  local s = small[x]
  if not s then
    s = string.format('%d', x)
    small[x] = s
  end
  return s
end

-- Ids this pop has seen: true once reserved (its writes are sent after the batch).
local taken = {}
-- Set when a suspect ended the pop (handed out alone, or left for the next pop).
local ended = false

-- A suspect goes back to the head of where it came from: the next pop hands it out alone.
local function put_back(id, score, g)
  if g then
    if score then
      gcount(redis.call('ZADD', gbase .. ':gp:' .. g, string.format('%.0f', score), id))
    else
      redis.call('LPUSH', gbase .. ':g:' .. g, id)
      gcount(1)
    end
    if not redis.call('ZSCORE', KEYS[16], g) then
      redis.call('ZADD', KEYS[16], 0, g)
    end
  elseif score then
    redis.call('ZADD', KEYS[13], string.format('%.0f', score), id)
  else
    redis.call('LPUSH', KEYS[1], id)
  end
end

-- Reserve or drop the candidate ids (and their groups, when taken from the ring), in
-- order; returns the index of the first one not taken (a suspect ended the pop: it and
-- those after it are to go back), or nil.
local function take(ids, groups)
  -- Everything the checks need, read first: one call a step for the whole batch, kept
  -- by position (at[i]: the id's place among the usable ones, false for an unusable id;
  -- no at when every id is usable, the usual case: two tables a batch fewer).
  local at, vids = nil, ids
  for _, id in ipairs(ids) do
    if not valid_id(id) then
      at, vids = {}, {}
      for i, v in ipairs(ids) do
        if valid_id(v) then
          vids[#vids + 1] = v
          at[i] = #vids
        else
          at[i] = false
        end
      end
      break
    end
  end
  local b, c, r, d, f = {}, {}, {}, {}, {}
  if #vids > 0 then
    b = redis.call('HMGET', KEYS[5], unpack(vids))
    c = redis.call('HMGET', KEYS[6], unpack(counter_fields(vids)))
    r = redis.call('ZMSCORE', KEYS[3], unpack(vids))
    d = redis.call('ZMSCORE', KEYS[12], unpack(vids))
    f = redis.call('ZMSCORE', KEYS[7], unpack(vids))
  end
  -- (reserved_skiplist.lua, prepended: first, so that a new key starts as a skiplist)
  local zadd, hset = {'+inf', RESERVED_MARK}, {}
  local stop = nil
  for i, id in ipairs(ids) do
    local j = i
    if at then j = at[i] end
    local body, busy, finished, c1, c2, c3, c4 = false, false, false, nil, nil, nil, nil
    if j then
      body, busy, finished = b[j], r[j], d[j] or f[j]
      c1, c2, c3, c4 = c[4 * j - 3], c[4 * j - 2], c[4 * j - 1], c[4 * j]
      local seen = taken[id]
      if seen then
        -- A copy of a job reserved earlier in this pop: that run covers it.
        busy = true
      elseif seen == false then
        -- A copy of one seen earlier in this pop and not reserved: what that copy did
        -- (dropped, failed, forgotten) is what Redis holds now.
        body = redis.call('HGET', KEYS[5], id)
        if body then
          c1, c2, c3, c4 = unpack(redis.call('HMGET', KEYS[6], id, id .. ':e', id .. ':s', id .. ':c'))
          busy = redis.call('ZSCORE', KEYS[3], id)
          finished = redis.call('ZSCORE', KEYS[12], id) or redis.call('ZSCORE', KEYS[7], id)
        end
      else
        taken[id] = false
      end
    end
    local attempts, exceptions, stalls, sound = nil, nil, nil, true
    if body then
      attempts, exceptions, stalls = counter(c1), counter(c2), counter(c3)
      sound = attempts ~= nil and exceptions ~= nil and stalls ~= nil
    end
    if not j then
      -- Not a usable job id: keep what it pointed to (or the id itself) for inspection.
      local raw = redis.call('HGET', KEYS[5], id)
      if raw then forget(id) end
      fail(raw_id(), 'malformed queue entry: job id is not printable ASCII', raw or id)
    elseif not body then
      if #id == 32 and string.match(id, '^%x+$') then
        -- A stale copy of a job that already finished: nothing to run.
        dropped = dropped + 1
      else
        -- Not a job id: a raw payload someone pushed. Keep it for inspection.
        fail(raw_id(), 'malformed queue entry: not a job id', id)
      end
    elseif busy then
      -- Duplicate id of a job being run right now: that run covers it.
      dropped = dropped + 1
    elseif finished then
      -- A finished (or failed) job put back: a replay of a copied envelope. Drop it.
      forget(id)
      dropped = dropped + 1
    elseif not sound then
      fail(id, 'corrupt attempts counter beside the job (not an integer); ' ..
        '`notify-worker failed retry` runs it again with fresh counters', body)
    elseif #body > max_bytes then
      fail(id, 'payload too large: ' .. #body .. ' bytes', body)
    elseif not envelope_shaped(body) and not pcall(cjson.decode, body) then
      -- Decoded only off the frame (RELIABILITY B1); JSON that is not an envelope goes
      -- to the worker, which refuses it on first sight as a bad signature (B5).
      fail(id, 'malformed payload: not JSON', body)
    elseif stalls > 0 and n > 0 and not c4 then
      -- A suspect (its lease expired before: its worker died or froze with it) is handed
      -- out alone, so a job that kills its process takes no neighbours down with it.
      stop = i
      ended = true
      break
    else
      local z = #zadd
      zadd[z + 1], zadd[z + 2] = lease_end, id
      if groups and groups[i] then redis.call('SADD', gbase .. ':gr:' .. groups[i], id) end
      -- One read and one write of the counters (attempts, exceptions, stalls, token).
      attempts = attempts + 1
      last = last + 1
      local tok = string.format('%d', last)
      local h = #hset
      hset[h + 1], hset[h + 2], hset[h + 3], hset[h + 4] = id, num(attempts), id .. ':t', tok
      taken[id] = true
      local g = #got
      got[g + 1], got[g + 2] = id, tok
      local o = #out
      out[o + 1], out[o + 2], out[o + 3], out[o + 4] = id, attempts, body, last
      out[o + 5] = more(exceptions, stalls, c4)
      n = n + 1
      if stalls > 0 and not c4 then
        -- A failing mark its last holder left (extend.lua) names that holder's token:
        -- stale now, and ack does not look for it.
        redis.call('HDEL', KEYS[6], id .. ':f')
        stop = i + 1
        ended = true
        break
      end
    end
  end
  if #zadd > 2 then each('ZADD', KEYS[3], zadd, 2) end
  if #hset > 0 then
    -- (attempts_hashtable.lua, prepended: keeps the hash in Redis's hashtable encoding)
    hset[#hset + 1], hset[#hset + 2] = HT_FIELD, HT_VALUE
  end
  each('HSET', KEYS[6], hset, 4)
  if stop and stop <= #ids then return stop end
  return nil
end

local plain = not groups_on and (not prio_on or redis.call('ZCARD', KEYS[13]) == 0)
if plain then
  -- No priorities waiting and no groups: the ready list alone, in batches.
  while n < max and not ended do
    local want = math.min(max - n, TAKE)
    local ids = redis.call('LPOP', KEYS[1], num(want))
    if not ids then break end
    local stop = take(ids)
    if stop then
      -- The ids from the suspect on go back to the head, in their order.
      local back = {}
      for i = #ids, stop, -1 do back[#back + 1] = ids[i] end
      redis.call('LPUSH', KEYS[1], unpack(back))
    end
    if #ids < want then break end
  end
else
  while n < max and not ended do
    local id, score, g = next_id()
    if not id then break end
    if take({id}, {g or false}) then put_back(id, score, g) end
  end
end
if #got > 0 then
  redis.call('SET', KEYS[10], string.format('%d', last))
  redis.call('SET', KEYS[11], seq .. '|' .. table.concat(got, ' '), 'PX', ARGV[2])
end
out[3] = dropped
if forgot then attempts_tidy(KEYS[6]) end
for _, b in ipairs(broken) do out[#out + 1] = b end

if redis.call('LLEN', KEYS[1]) == 0 and (not prio_on or redis.call('ZCARD', KEYS[13]) == 0)
  and (not groups_on or redis.call('ZCARD', KEYS[16]) == 0 or (n == 0 and max > 0)) then
  -- Nothing left to wake anyone for: stale tokens would only cause empty pops.
  redis.call('DEL', KEYS[4])
  local wait = -1
  for _, key in ipairs({KEYS[2], KEYS[3]}) do
    local head = redis.call('ZRANGE', key, '0', '0', 'WITHSCORES')
    local s = tonumber(head[2] or '')
    -- (+inf: the reserved zset's skiplist mark alone, no lease to wait for)
    if s and s < math.huge then
      local w = math.max(0, s - now)
      if wait < 0 or w < wait then wait = w end
    end
  end
  if groups_on and n == 0 and max > 0 and redis.call('ZCARD', KEYS[16]) > 0 then
    -- Only groups at their limits are left: look again soon (an ack of one of their
    -- jobs also wakes a worker).
    if wait < 0 or wait > 100 then wait = 100 end
  end
  out[2] = wait
else
  out[2] = 0
end
return out
