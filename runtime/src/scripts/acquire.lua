-- Acquire a lock and issue its fencing token, in one atomic step.
--
-- KEYS[1]  lock key: a hash {owner = <owner token>, fence = <fencing token>}
-- KEYS[2]  fence counter of this lock key (same hash slot)
-- ARGV[1]  owner token (40 hex chars, new for every acquisition)
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  how long the fence counter outlives its last use, in milliseconds
-- ARGV[4]  optional: the clock's step in µs for tokens (default 1). Redlock passes 1000, so that
--          masters whose clocks agree to the millisecond vote the same token and the client can
--          skip the write-back round trip.
--
-- Returns {1, fence}   acquired (or already ours: an idempotent retry refreshes the TTL and
--                      returns the token issued the first time)
--         {0, pttl}    held by another owner, which keeps it for pttl more milliseconds
--
-- Fencing tokens are max(counter + 1, server time in µs). The counter keeps them increasing when the
-- server clock steps back; the clock keeps them increasing after the counter expires or is deleted,
-- which is what bounds the counters' memory. Both stay exact as Lua doubles below 2^53 (about 285
-- years of µs). Numbers are written with string.format('%.0f'): tostring() would keep only 14
-- significant digits and lose the low digits of a µs timestamp.
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, tonumber(redis.call('HGET', KEYS[1], 'fence'))}
end
if owner then
  return {0, redis.call('PTTL', KEYS[1])}
end
local now = redis.call('TIME')
local step = tonumber(ARGV[4] or '1')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
now_us = now_us - now_us % step
local last = tonumber(redis.call('GET', KEYS[2]) or '0')
local fence = math.max(last + 1, now_us)
local fence_text = string.format('%.0f', fence)
redis.call('SET', KEYS[2], fence_text, 'PX', ARGV[3])
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'fence', fence_text)
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return {1, fence}
