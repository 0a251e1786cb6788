-- Release a shared lock's holder (a reader or a permit), waking who waits for it.
--
-- KEYS[1]  lock key, KEYS[2] its holders (layout: shared_acquire.lua); the notification channel
--          is KEYS[1]:released
-- ARGV[1]  the member: "<owner> <label>"
-- ARGV[2]  how long the token marker left in a freed key lives, in milliseconds
-- ARGV[3]  how long the waiters a release notifies have the lock first, in milliseconds
-- ARGV[4]  the command that announces a release: PUBLISH, or SPUBLISH (Redis Cluster)
--
-- Returns 1 released, 0 the holder's lease had expired (nothing of it was left), 2 released but
-- the server refused the announcement (the user may not publish on the channel).
local time = redis.call('TIME')
local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
local now_ms = math.floor(now_us / 1000)
local expiry = redis.call('ZSCORE', KEYS[2], ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
if not expiry or tonumber(expiry) <= now_ms then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
if state ~= 'R' and state ~= 'S' and state ~= 'M' and state ~= 'N' then
  return 0
end
local space = string.find(value, ' ', 2, true)
local fence = string.sub(value, 2, (space or 0) - 1)
local waited = state == 'S' or state == 'N'
if redis.call('ZCARD', KEYS[2]) == 0 then
  if waited then
    -- The notified waiters have it first for a moment: the waiting writer alone ("V": readers
    -- turned away by its intent wait behind it), or the semaphore's waiters ("P").
    local until_us = now_us + tonumber(ARGV[3]) * 1000
    local marker = 'P'
    if state == 'S' then
      -- The writer's intent says how long it is known to wait: its reservation lasts as long.
      marker = 'V'
      until_us = math.max(until_us, tonumber(string.sub(value, space + 1)))
    end
    redis.call('SET', KEYS[1], marker .. fence .. ' ' .. string.format('%.0f', until_us), 'PX', ARGV[2])
  else
    redis.call('SET', KEYS[1], 'F' .. fence, 'PX', ARGV[2])
  end
  redis.call('DEL', KEYS[2])
elseif state == 'N' then
  -- A permit is free: announce it; the next waiter that asks takes it.
  redis.call('SETRANGE', KEYS[1], 0, 'M')
else
  return 1
end
if waited then
  -- pcall: a refused PUBLISH must not turn a done release into an error reply.
  local published = redis.pcall(ARGV[4], KEYS[1] .. ':released', KEYS[1])
  if type(published) == 'table' and published.err then
    return 2
  end
end
return 1
