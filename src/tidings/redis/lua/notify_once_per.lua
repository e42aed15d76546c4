-- notify_once_per: let one notification through per period (a notification's once_per).
-- KEYS[1] marker ({prefix}:notify:once:{<hash of notifiable, type, key>})
-- ARGV[1] token of this notify() call (re-sent commands carry the same one)
-- ARGV[2] period ms
-- Returns 1 when this call may send (it set the marker, or set it before: a re-sent
-- command whose reply was lost), 0 when an earlier call holds the period.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', tonumber(ARGV[2])) then return 1 end
if redis.call('GET', KEYS[1]) == ARGV[1] then return 1 end
return 0
