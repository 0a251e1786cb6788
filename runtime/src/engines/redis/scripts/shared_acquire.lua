-- Take a shared lock: a read lock (many readers, no writer) or one permit of a semaphore.
--
-- KEYS[1]  lock key (its layout: acquire.lua), whose value, while shared holders hold it, is
--            "R<fence>"            read-held
--            "S<fence> <until_us>" read-held, and a writer waits: new readers queue behind it
--                                  until server time until_us (the writer renews the intent
--                                  each time it asks)
--            "M<fence>"            a semaphore with holders
--            "N<fence>"            the same, and someone was told it is full (a release
--                                  announces itself)
--          and lives as long as its longest-living holder
-- KEYS[2]  the holders: a sorted set, member "<owner> <label>", score the holder's expiry in
--          server milliseconds — each holder has its own lease, and an expired one is dropped
--          by the next call that looks (a dead reader or permit holder blocks nobody past its
--          TTL)
-- ARGV[1]  'R' a reader, 'M' a permit
-- ARGV[2]  the semaphore's permits (ignored for a reader)
-- ARGV[3]  the member: "<owner> <label>"
-- ARGV[4]  lease TTL in milliseconds
-- ARGV[5]  who asks: "0" once, "1" first try of a waiter, "2" a waiter (see acquire.lua)
--
-- Returns {1, fence} granted (or already ours: an idempotent retry refreshes the lease and
--                    answers the key's latest token — for a permit, possibly a later holder's);
--         {0, ms}    busy for about ms more (a writer holds or waits, or no permit is free);
--         {3, ms}    free but left to the waiters a release notified for ms more;
--         {-2, 0}    the key holds a value distlock did not write;
--         {-3, 0}    the key is a lock of another kind (a semaphore taken as a read lock, or
--                    the reverse)
--
-- A reader's token is the last token issued on the key (a writer granted later gets a larger
-- one), so a resource can reject a reader's late write-back once a newer writer wrote. A permit
-- gets a new token, max(last + 1, server µs), like a writer.
local kind, permits, member, ttl, asker = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
local space = value and string.find(value, ' ', 2, true)
local last = 0
if value then
  last = tonumber(string.sub(value, 2, (space or 0) - 1))
  if not last then
    return {-2, 0}
  end
end
if state == 'L' or state == 'W' or state == 'H' then
  if kind == 'M' then
    return {-3, 0}
  end
  if state ~= 'W' and asker ~= '0' then
    redis.call('SETRANGE', KEYS[1], 0, 'W')
  end
  return {0, redis.call('PTTL', KEYS[1])}
end
if ((state == 'R' or state == 'S') and kind == 'M') or ((state == 'M' or state == 'N') and kind == 'R') then
  return {-3, 0}
end
if value and not string.find('FPQVRSMN', state, 1, true) then
  return {-2, 0}
end
if (state == 'P' or state == 'Q' or state == 'V') and space then
  local left = math.ceil((tonumber(string.sub(value, space + 1)) - now_us) / 1000)
  -- "V": the last reader left for a waiting writer; no reader takes it first.
  if left > 0 and (asker ~= '2' or state == 'V') then
    if state == 'P' and asker == '1' then
      redis.call('SETRANGE', KEYS[1], 0, 'Q')
    end
    return {3, left}
  end
end
local shared = state == 'R' or state == 'S' or state == 'M' or state == 'N'
if shared then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
end
local mine = shared and redis.call('ZSCORE', KEYS[2], member)
local fence = last
if not mine then
  if state == 'S' then
    local until_us = tonumber(string.sub(value, space + 1))
    if until_us > now_us then
      return {0, math.ceil((until_us - now_us) / 1000)}
    end
  end
  if kind == 'M' then
    if shared and redis.call('ZCARD', KEYS[2]) >= permits then
      if state == 'M' and asker ~= '0' then
        redis.call('SETRANGE', KEYS[1], 0, 'N')
      end
      local first = redis.call('ZRANGE', KEYS[2], 0, 0, 'WITHSCORES')
      return {0, math.max(tonumber(first[2]) - now_ms, 1)}
    end
    fence = math.max(last + 1, now_us)
  elseif last == 0 then
    fence = now_us
  end
end
redis.call('ZADD', KEYS[2], now_ms + ttl, member)
-- The lock key lives as long as its longest-living holder.
local longest = redis.call('ZRANGE', KEYS[2], -1, -1, 'WITHSCORES')
local live_ms = math.max(tonumber(longest[2]) - now_ms, 1)
local next_value
if kind == 'R' then
  if state == 'S' and tonumber(string.sub(value, space + 1)) > now_us then
    next_value = value
  else
    next_value = 'R' .. string.format('%.0f', fence)
  end
else
  next_value = (state == 'N' and 'N' or 'M') .. string.format('%.0f', fence)
end
redis.call('SET', KEYS[1], next_value, 'PX', live_ms)
redis.call('PEXPIRE', KEYS[2], live_ms)
return {1, fence}
