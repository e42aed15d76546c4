-- ack: delete finished jobs and record them as done, each only while its reservation
-- token still matches (a stale holder cannot erase the reservation of the job's new holder).
-- KEYS[1] reserved zset   KEYS[2] jobs hash   KEYS[3] attempts hash   KEYS[4] done zset
-- KEYS[5] this worker's ack receipt ({prefix}:queue:{Q}:rcpt:ack:<worker>)
-- ARGV[1] how long done records are kept (ms)   ARGV[2] most done records kept
-- ARGV[3] the worker's ack sequence number   ARGV[4..] id1, token1, id2, token2, ...
-- Returns the ids whose reservation had been lost (their token no longer matches: the
-- lease expired and the job was handed out again, or it finished elsewhere); those are
-- left alone.
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
local lost = {}
for i = 4, #ARGV, 2 do
  local id = ARGV[i]
  if redis.call('HGET', KEYS[3], id .. ':t') == ARGV[i + 1] then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    redis.call('HDEL', KEYS[3], id, id .. ':e', id .. ':t', id .. ':s')
    redis.call('ZADD', KEYS[4], now, id)
  else
    lost[#lost + 1] = id
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now - tonumber(ARGV[1]))
redis.call('ZREMRANGEBYRANK', KEYS[4], 0, -(tonumber(ARGV[2]) + 1))
redis.call('SET', KEYS[5], seq .. '|' .. table.concat(lost, ' '), 'PX', 600000)
return lost
