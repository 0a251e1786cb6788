-- Remove a lock whoever holds it — an operator's `distlock unlock --force` — and wake its waiters.
-- The key becomes the token marker one above the removed holder's token, so every later token is
-- larger: the next holder's fenced writes make the resource reject the removed holder's.
--
-- KEYS[1]  lock key (its layout: acquire.lua); its notification channel is KEYS[1]:released
-- ARGV[1]  how long the token marker lives, in milliseconds
-- ARGV[2]  the command that announces a release: PUBLISH, or SPUBLISH (Redis Cluster)
-- ARGV[3]  how to count the channel's subscribers: NUMSUB, or SHARDNUMSUB
--
-- Returns what inspect.lua returns for the holder it removed, or an empty array when the lock
-- was free (nothing is written then).
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
if not value or state == 'F' or state == 'P' or state == 'Q' or state == 'V' then
  return {}
end
if state == 'R' or state == 'S' or state == 'M' or state == 'N' then
  -- Shared (readers, a semaphore): every holder goes; they learn it at their next renewal.
  local stop = string.find(value, ' ', 2, true)
  local fence = tonumber(string.sub(value, 2, (stop or 0) - 1))
  local holders = KEYS[1] .. ':holders'
  local count = redis.call('ZCARD', holders)
  local pttl = redis.call('PTTL', KEYS[1])
  redis.call('DEL', holders)
  redis.call('SET', KEYS[1], 'F' .. string.format('%.0f', fence + 1), 'PX', ARGV[1])
  redis.pcall(ARGV[2], KEYS[1] .. ':released', KEYS[1])
  return {'', fence, pttl, '', (state == 'S' or state == 'N') and 1 or 0, -1, count}
end
local space = string.find(value, ' ', 2, true)
if (state ~= 'L' and state ~= 'W' and state ~= 'H') or not space then
  return redis.error_reply('DISTLOCK ' .. KEYS[1] .. ' holds a value distlock did not write')
end
local stop = string.find(value, ' ', space + 1, true)
local owner = string.sub(value, space + 1, (stop or 0) - 1)
local label = stop and string.sub(value, stop + 1) or ''
local fence = tonumber(string.sub(value, 2, space - 1))
local channel = KEYS[1] .. ':released'
local waiting = -1
local counted = redis.pcall('PUBSUB', ARGV[3], channel)
if type(counted) == 'table' and not counted.err then
  waiting = counted[2]
end
local pttl = redis.call('PTTL', KEYS[1])
redis.call('SET', KEYS[1], 'F' .. string.format('%.0f', fence + 1), 'PX', ARGV[1])
-- Every waiter is told, whether or not the lock was marked as waited on.
redis.pcall(ARGV[2], channel, KEYS[1])
return {owner, fence, pttl, label, (state == 'W' or state == 'H') and 1 or 0, waiting}
