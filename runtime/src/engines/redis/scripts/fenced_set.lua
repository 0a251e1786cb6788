-- Resource-side fencing: write a value only if the writer's fencing token is at least the highest
-- token this resource has accepted. A holder whose lease expired (paused, partitioned) carries an
-- older token than the next holder, so its late write is rejected here even though it still
-- believes it holds the lock.
--
-- KEYS[1]  resource key: a hash {value = <value>, token = <highest accepted token>}
-- ARGV[1]  the writer's fencing token
-- ARGV[2]  the value to write
--
-- Returns {1, token}     written; token is the writer's
--         {0, highest}   rejected: a newer token has written already
local highest = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
local token = tonumber(ARGV[1])
if token < highest then
  return {0, highest}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'token', ARGV[1])
return {1, token}
