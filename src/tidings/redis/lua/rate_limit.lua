-- rate_limit: take one slot of a global rate limit (GCRA on Redis's clock).
-- KEYS[1] limiter state ({prefix}:limit:{<key>}: theoretical arrival time, µs)
-- ARGV[1] emission interval µs (period / limit)   ARGV[2] burst (slots usable at once, >= 1)
-- Returns 0 when the slot was taken, else the µs to wait before one frees up.
-- Within any window of W µs at most W / interval + burst slots are handed out, whichever
-- worker asks: the state lives in Redis and time is Redis TIME, not the callers' clocks.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval, burst = tonumber(ARGV[1]), tonumber(ARGV[2])
local tat = tonumber(redis.call('GET', KEYS[1]) or now)
-- State written by hand (not a number, nan, inf, or further ahead than a full
-- burst can put it) would raise or block the limit for ever: start it afresh.
if not tat or tat ~= tat or tat > now + interval * burst then tat = now end
if tat < now then tat = now end
local allow_at = tat + interval - interval * burst
if now < allow_at then return allow_at - now end
local new_tat = tat + interval
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.ceil((new_tat - now) / 1000) + 1)
return 0
