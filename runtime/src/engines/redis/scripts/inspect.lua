-- Who holds a lock, for how long, with which token and label, and who waits for it.
--
-- KEYS[1]  lock key (its layout: acquire.lua); its notification channel is KEYS[1]:released
-- ARGV[1]  how to count the channel's subscribers: NUMSUB, or SHARDNUMSUB (Redis Cluster)
--
-- Returns {owner, fence, pttl, label, waited_on, waiting} while held, or an empty array when free:
--   label      the holder label ("" when none was written)
--   waited_on  1 when a caller was told the lock is busy since it was taken, else 0
--   waiting    connections subscribed to the release channel (one per process with waiters),
--              or -1 when the server refused to count them (the user may not run PUBSUB)
-- A shared lock (readers, a semaphore: shared_acquire.lua) answers owner "", its last token, the
-- longest holder's TTL, one holder's label, whether a writer (or a waiter) waits, the waiting
-- count, and a 7th element: how many hold it.
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
if not value or state == 'F' or state == 'P' or state == 'Q' or state == 'V' then
  return {}
end
local counted = redis.pcall('PUBSUB', ARGV[1], KEYS[1] .. ':released')
local waiting = -1
if type(counted) == 'table' and not counted.err then
  waiting = counted[2]
end
if state == 'R' or state == 'S' or state == 'M' or state == 'N' then
  -- Shared: no single owner; the live holders are counted (expired ones dropped first).
  local holders = KEYS[1] .. ':holders'
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  local alive = '(' .. now_ms
  local count = redis.call('ZCOUNT', holders, alive, '+inf')
  if count == 0 then
    return {}
  end
  local stop = string.find(value, ' ', 2, true)
  local longest = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  local first = redis.call('ZRANGEBYSCORE', holders, alive, '+inf', 'LIMIT', 0, 1)
  local label = string.match(first[1], ' (.*)$') or ''
  return {'', tonumber(string.sub(value, 2, (stop or 0) - 1)), tonumber(longest[2]) - now_ms,
    label, (state == 'S' or state == 'N') and 1 or 0, waiting, count}
end
local space = string.find(value, ' ', 2, true)
if (state ~= 'L' and state ~= 'W' and state ~= 'H') or not space then
  return redis.error_reply('DISTLOCK ' .. KEYS[1] .. ' holds a value distlock did not write')
end
local stop = string.find(value, ' ', space + 1, true)
local owner = string.sub(value, space + 1, (stop or 0) - 1)
local label = stop and string.sub(value, stop + 1) or ''
return {owner, tonumber(string.sub(value, 2, space - 1)), redis.call('PTTL', KEYS[1]), label,
  (state == 'W' or state == 'H') and 1 or 0, waiting}
