-- Acquire a lock and issue its fencing token, in one atomic step.
--
-- KEYS[1]  lock key. Its value is one string, so a lock costs one key and one SET:
--            "L<fence> <owner>"  held
--            "W<fence> <owner>"  held, and someone was told it is busy (release will publish)
--            "F<fence>"          free: the last token issued, kept by release for the counter TTL
-- ARGV[1]  owner token (new for every acquisition; no spaces)
-- ARGV[2]  lease TTL in milliseconds
-- ARGV[3]  optional: the clock's step in µs for tokens (default 1). Redlock passes 1000, so that
--          masters whose clocks agree to the millisecond vote the same token and the client can
--          skip the write-back round trip.
--
-- Returns {1, fence}   acquired (or already ours: an idempotent retry refreshes the TTL and
--                      returns the token issued the first time)
--         {0, pttl}    held by another owner, which keeps it for pttl more milliseconds; the lock
--                      is marked as waited on, so its release announces itself
--
-- Fencing tokens are max(last + 1, server time in µs), `last` being the token a release left in
-- the key. The marker keeps tokens increasing when the server clock steps back; the clock keeps them
-- increasing once the marker is gone (or the lock expired instead of being released), which is what
-- bounds memory. Both stay exact as Lua doubles below 2^53 (about 285 years of µs). Numbers are
-- written with string.format('%.0f'): tostring() keeps only 14 significant digits.
local value = redis.call('GET', KEYS[1])
local last = 0
if value then
  local state = string.sub(value, 1, 1)
  if state == 'F' then
    last = tonumber(string.sub(value, 2)) or 0
  else
    local space = string.find(value, ' ', 2, true)
    if (state ~= 'L' and state ~= 'W') or not space then
      return redis.error_reply('DISTLOCK ' .. KEYS[1] .. ' holds a value distlock did not write')
    end
    if string.sub(value, space + 1) == ARGV[1] then
      redis.call('PEXPIRE', KEYS[1], ARGV[2])
      return {1, tonumber(string.sub(value, 2, space - 1))}
    end
    if state == 'L' then
      redis.call('SETRANGE', KEYS[1], 0, 'W')
    end
    return {0, redis.call('PTTL', KEYS[1])}
  end
end
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
if ARGV[3] then
  now_us = now_us - now_us % tonumber(ARGV[3])
end
local fence = math.max(last + 1, now_us)
redis.call('SET', KEYS[1], 'L' .. string.format('%.0f', fence) .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {1, fence}
