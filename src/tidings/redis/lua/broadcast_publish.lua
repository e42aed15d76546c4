-- broadcast_publish: append one broadcast message to a channel's stream, once.
-- KEYS[1] the channel's stream ({prefix}:broadcast:{b}:<channel>)
-- KEYS[2] receipt of this message on this channel ({prefix}:broadcast:{b}:rcpt:<id>:<channel>)
-- ARGV[1] MAXLEN (approximate, "~") the stream is trimmed to
-- ARGV[2] how long the receipt is kept (ms)
-- ARGV[3] event name   ARGV[4] data (JSON text)
-- Returns the stream id of the message: the one just added, or, when the receipt exists
-- (a re-sent script whose reply was lost, a retried job), the one added before.
local done = redis.call('GET', KEYS[2])
if done then return done end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', tonumber(ARGV[1]), '*',
  'e', ARGV[3], 'd', ARGV[4])
redis.call('SET', KEYS[2], id, 'PX', tonumber(ARGV[2]))
return id
