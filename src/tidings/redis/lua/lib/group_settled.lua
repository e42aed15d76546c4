-- Shared by ack, fail and cancel_settle (prepended by tidings.redis.scripts): a settled
-- job of a fair group leaves its group's running set. KEYS[1] is the queue's reserved
-- zset in each of them; every group key derives from the queue's base key (one tag).
local gbase = string.sub(KEYS[1], 1, -10)
local groups_on = redis.call('EXISTS', gbase .. ':gon') == 1
local function group_settled(id, g, stat)
  local run, gl, gp = gbase .. ':gr:' .. g, gbase .. ':g:' .. g, gbase .. ':gp:' .. g
  redis.call('SREM', run, id)
  if stat then redis.call('HINCRBY', gbase .. ':gstat', stat .. ':' .. g, 1) end
  if redis.call('LLEN', gl) == 0 and redis.call('EXISTS', gp) == 0 then
    -- An emptied group leaves nothing behind.
    if redis.call('SCARD', run) == 0 then
      redis.call('HDEL', gbase .. ':gstat', 'd:' .. g, 'f:' .. g)
    end
  elseif redis.call('HEXISTS', gbase .. ':gcfg', 'c:' .. g) == 1
    and redis.call('LLEN', gbase .. ':notify') < 64 then
    -- A slot freed in a limited group with jobs waiting: wake a worker for them.
    redis.call('RPUSH', gbase .. ':notify', '1')
  end
end
