-- broadcast_publish: append one broadcast message to a channel's stream, once.
-- KEYS[1] the channel's stream ({prefix}:broadcast:{streams}:ch:<channel>)
-- KEYS[2] hash: message id -> stream id, of the channel's recent messages (...:ids:<channel>)
-- KEYS[3] list: those message ids, newest first (...:idq:<channel>)
-- ARGV[1] MAXLEN (approximate, "~") the stream is trimmed to; the ids remembered too
-- ARGV[2] how long (ms) the two id keys outlive the channel's last publish
-- ARGV[3] event name   ARGV[4] data (JSON text)   ARGV[5] message id
-- Returns the stream id of the message: the one just added, or, when the message id is
-- among the channel's last MAXLEN (a re-sent script whose reply was lost, a retried job),
-- the one added before. Memory stays O(MAXLEN) per channel whatever the message count:
-- the ids are trimmed with the stream, and no key is made per message.
-- Each entry also carries its predecessor's id (p), so a reader can tell whether
-- trimming dropped anything newer than a given id (the tidings.gap event).
local known = redis.call('HGET', KEYS[2], ARGV[5])
if known then return known end
local keep = tonumber(ARGV[1])
local tail = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local prev = '0-0'
if tail[1] then prev = tail[1][1] end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', keep, '*',
  'e', ARGV[3], 'd', ARGV[4], 'm', ARGV[5], 'p', prev)
redis.call('HSET', KEYS[2], ARGV[5], id)
redis.call('LPUSH', KEYS[3], ARGV[5])
if redis.call('LLEN', KEYS[3]) > keep then
  local gone = redis.call('LRANGE', KEYS[3], keep, -1)
  redis.call('LTRIM', KEYS[3], 0, keep - 1)
  redis.call('HDEL', KEYS[2], unpack(gone))
end
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[3], tonumber(ARGV[2]))
return id
