-- Record a fencing token granted by a quorum (Redlock) on one master, so that every later quorum
-- meets a master that knows it: raise the fence counter to at least the token and store it as the
-- lock's token — only where the lock is still ours.
--
-- KEYS[1]  lock key (a hash {owner, fence})
-- KEYS[2]  fence counter of this lock key (same hash slot)
-- ARGV[1]  owner token
-- ARGV[2]  the granted fencing token (an integer below 2^53)
-- ARGV[3]  how long the fence counter outlives its last use, in milliseconds
--
-- Returns 1  recorded
--         0  the lock is not ours here (expired, released, taken): nothing written
--
-- Numbers are written with string.format('%.0f'), never tostring(), which keeps only 14
-- significant digits.
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
local token = tonumber(ARGV[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local counter = string.format('%.0f', math.max(last, token))
redis.call('SET', KEYS[2], counter, 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
