-- ack: delete finished jobs and record them as done, each only while its reservation
-- token still matches (a stale holder cannot erase the reservation of the job's new holder);
-- a job that returned a value to keep has it stored in the same step.
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash   KEYS[4] done zset
-- KEYS[5] this worker's ack receipt ({prefix}:queue:{Q}:rcpt:ack:<worker>)
-- KEYS[6..] the result keys of the jobs that keep one ({prefix}:queue:{Q}:result:<id>),
-- in the order of their entries below; each is also the channel its waiters listen on
-- ARGV[1] how long done records are kept (ms)   ARGV[2] most done records kept
-- ARGV[3] the worker's ack sequence number
-- ARGV[4] P, the number of plain entries   ARGV[5..4+2P] id1, token1, id2, token2, ...
-- then one entry per job keeping a result: id, token, result ttl (ms), signed result
-- Returns the ids whose reservation had been lost (their token no longer matches: the
-- lease expired and the job was handed out again, or it finished elsewhere); those are
-- left alone, and their results are not written: a result is stored at most once per
-- successful run, by the run that still held the job.
-- Run twice: a worker sends its acks one call at a time, so the receipt of its last call
-- is enough to recognise a re-sent one; it gets the first run's answer and changes nothing.
local rcpt = redis.call('GET', KEYS[5])
local seq = ARGV[3]
if rcpt and string.sub(rcpt, 1, #seq + 1) == seq .. '|' then
  local lost = {}
  for id in string.gmatch(string.sub(rcpt, #seq + 2), '%S+') do lost[#lost + 1] = id end
  return lost
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- Fair groups (see pop.lua): a job of a group leaves its group's running set here; its
-- group's keys all derive from the queue's base key (one hash tag). Garbage in a group's
-- structures never stops the move: that bookkeeping runs under pcall.
-- (group_settled, gbase and groups_on: lua/lib/group_settled.lua, prepended)
local lost = {}
-- Redis time per job is mostly the calls a script makes: the plain entries are checked
-- with one HMGET of their tokens and settled with one ZREM, two HDELs and one ZADD
-- for all of them (in chunks: unpack() takes at most ~8k values).
local function each(cmd, key, vals, per)
  local step = per * 1000
  for s = 1, #vals, step do
    redis.call(cmd, key, unpack(vals, s, math.min(s + step - 1, #vals)))
  end
end
-- now as a string made once: Redis formats a Lua number argument with printf per call.
local nows = string.format('%d', now)
-- Settle the entries ARGV[from], ARGV[from + step], ... up to ARGV[to] (each an id
-- followed by its token); true when at least one of them still held its job.
local function settle(from, to, step)
  local ask, per = {}, groups_on and 2 or 1
  for i = from, to, step do
    local a = #ask
    ask[a + 1] = ARGV[i] .. ':t'
    if groups_on then ask[a + 2] = ARGV[i] .. ':g' end
  end
  if #ask == 0 then return false end
  local have
  if #ask <= 4000 then
    have = redis.call('HMGET', KEYS[3], unpack(ask))
  else
    have = {}
    for s = 1, #ask, 4000 do
      local got = redis.call('HMGET', KEYS[3], unpack(ask, s, math.min(s + 3999, #ask)))
      for _, v in ipairs(got) do have[#have + 1] = v end
    end
  end
  local keep, fields, scores, grouped, seen = {}, {}, {}, {}, {}
  local k = 0
  for i = from, to, step do
    local id = ARGV[i]
    k = k + 1
    if seen[id] or have[per * (k - 1) + 1] ~= ARGV[i + 1] then
      -- Its token moved on (or the same id twice in one batch: the first settled it).
      lost[#lost + 1] = id
    else
      seen[id] = true
      keep[#keep + 1] = id
      local f = #fields
      fields[f + 1], fields[f + 2], fields[f + 3] = id, ask[per * (k - 1) + 1], id .. ':e'
      fields[f + 4], fields[f + 5], fields[f + 6] = id .. ':s', id .. ':p', id .. ':c'
      fields[f + 7] = id .. ':g'
      local z = #scores
      scores[z + 1], scores[z + 2] = nows, id
      local g = groups_on and have[per * k]
      if g then grouped[#grouped + 1] = {id, g} end
    end
  end
  -- ZREM first: at maxmemory a script's first write must be one that frees memory.
  each('ZREM', KEYS[1], keep, 1)
  each('HDEL', KEYS[2], keep, 1)
  -- The counter, the token and the fields most jobs never have (exceptions, stalls,
  -- priority, cancel mark, group) in one call: the hash is a hashtable while jobs are held
  -- (pop's field: attempts_hashtable.lua), one lookup a field whatever the order.
  each('HDEL', KEYS[3], fields, 7)
  each('ZADD', KEYS[4], scores, 2)
  for _, e in ipairs(grouped) do pcall(group_settled, e[1], e[2], 'd') end
  return #keep > 0
end
local plain_end = 4 + 2 * tonumber(ARGV[4])
settle(5, plain_end, 2)
local r = 6
for i = plain_end + 1, #ARGV, 4 do
  if settle(i, i, 4) then
    redis.call('SET', KEYS[r], ARGV[i + 3], 'PX', tonumber(ARGV[i + 2]))
    redis.call('PUBLISH', KEYS[r], 'done')
  end
  r = r + 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', string.format('%d', now - tonumber(ARGV[1])))
redis.call('ZREMRANGEBYRANK', KEYS[4], '0', string.format('%d', -(tonumber(ARGV[2]) + 1)))
-- (attempts_tidy: lua/lib/attempts_hashtable.lua, reserved_tidy: lua/lib/
-- reserved_skiplist.lua, both prepended: an emptied queue leaves neither key behind)
attempts_tidy(KEYS[3])
reserved_tidy(KEYS[1])
redis.call('SET', KEYS[5], seq .. '|' .. table.concat(lost, ' '), 'PX', '600000')
return lost
