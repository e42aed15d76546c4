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
local function done(id, token)
  if redis.call('HGET', KEYS[3], id .. ':t') ~= token then
    lost[#lost + 1] = id
    return false
  end
  local g = groups_on and redis.call('HGET', KEYS[3], id .. ':g')
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  redis.call('HDEL', KEYS[3], id, id .. ':e', id .. ':t', id .. ':s', id .. ':p', id .. ':c',
    id .. ':g')
  redis.call('ZADD', KEYS[4], now, id)
  if g then pcall(group_settled, id, g, 'd') end
  return true
end
local plain_end = 4 + 2 * tonumber(ARGV[4])
for i = 5, plain_end, 2 do
  done(ARGV[i], ARGV[i + 1])
end
local r = 6
for i = plain_end + 1, #ARGV, 4 do
  if done(ARGV[i], ARGV[i + 1]) then
    redis.call('SET', KEYS[r], ARGV[i + 3], 'PX', tonumber(ARGV[i + 2]))
    redis.call('PUBLISH', KEYS[r], 'done')
  end
  r = r + 1
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[1]))
redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -(tonumber(ARGV[2]) + 1))
redis.call('SET', KEYS[5], seq .. '|' .. table.concat(lost, ' '), 'PX', 600000)
return lost
