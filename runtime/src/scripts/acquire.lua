-- Acquire locks and issue their fencing tokens: one atomic step per key, for a batch of keys
-- (concurrent callers' acquires coalesced into one call; a lone caller sends a batch of one).
--
-- KEYS[i]    lock key i. Its value is one string, so a lock costs one key and one SET:
--              "L<fence> <owner>"  held
--              "W<fence> <owner>"  held, and someone was told it is busy (release will publish)
--              "F<fence>"          free: the last token issued, kept by release for the counter TTL
-- ARGV[1]    the clock's step in µs for tokens: 1, or 1000 for Redlock, so that masters whose
--            clocks agree to the millisecond vote the same token and the client can skip the
--            write-back round trip
-- ARGV[2i]   owner token of key i (new for every acquisition; no spaces)
-- ARGV[2i+1] lease TTL of key i in milliseconds
--
-- Returns a flat array, two elements per key:
--   1, fence    acquired (or already ours: an idempotent retry refreshes the TTL and returns the
--               token issued the first time)
--   0, pttl     held by another owner, which keeps it for pttl more milliseconds; the lock is
--               marked as waited on, so its release announces itself
--  -2, 0        the key holds a value distlock did not write (another program uses the name)
--
-- Fencing tokens are max(last + 1, server time in µs), `last` being the token a release left in
-- the key. The marker keeps tokens increasing when the server clock steps back; the clock keeps them
-- increasing once the marker is gone (or the lock expired instead of being released), which is what
-- bounds memory. Both stay exact as Lua doubles below 2^53 (about 285 years of µs). Numbers are
-- written with string.format('%.0f'): tostring() keeps only 14 significant digits.
local step = tonumber(ARGV[1])
local now_us
local result = {}
for i, key in ipairs(KEYS) do
  local owner, ttl = ARGV[2 * i], ARGV[2 * i + 1]
  local value = redis.call('GET', key)
  local last = 0
  local code, answer
  if value then
    local state = string.sub(value, 1, 1)
    if state == 'F' then
      last = tonumber(string.sub(value, 2)) or 0
    else
      local space = string.find(value, ' ', 2, true)
      if (state ~= 'L' and state ~= 'W') or not space then
        code, answer = -2, 0
      elseif string.sub(value, space + 1) == owner then
        redis.call('PEXPIRE', key, ttl)
        code, answer = 1, tonumber(string.sub(value, 2, space - 1))
      else
        if state == 'L' then
          redis.call('SETRANGE', key, 0, 'W')
        end
        code, answer = 0, redis.call('PTTL', key)
      end
    end
  end
  if not code then
    if not now_us then
      local now = redis.call('TIME')
      now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
      now_us = now_us - now_us % step
    end
    local fence = math.max(last + 1, now_us)
    redis.call('SET', key, 'L' .. string.format('%.0f', fence) .. ' ' .. owner, 'PX', ttl)
    code, answer = 1, fence
  end
  result[2 * i - 1] = code
  result[2 * i] = answer
end
return result
