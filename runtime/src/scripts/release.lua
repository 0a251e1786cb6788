-- Release locks if, and only if, each is still ours; tell waiters a lock is free if anyone waits.
-- A batch of keys (concurrent callers' releases coalesced into one call; a lone caller sends a
-- batch of one).
--
-- KEYS[i]    lock key i (its layout: acquire.lua); its notification channel is KEYS[i]:released
-- ARGV[1]    how long the token marker left in a released key lives, in milliseconds
-- ARGV[2]    how long the waiters a release notifies have the lock first, in milliseconds
-- ARGV[3]    the command that announces a release: PUBLISH, or SPUBLISH (sharded pub/sub, on
--            the node owning the key's slot, in a Redis Cluster)
-- ARGV[i+3]  owner token of key i
--
-- Returns an array, one element per key:
--   1   released (and, if it was waited on, published on the channel)
--   2   released, but the server refused the notification (the user may not publish on the
--       channel): the release stands, waiters elsewhere learn of it by backoff
--   0   the lock is free: it expired before we released it
--  -1   another owner holds it now (or another program wrote the key): left untouched
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
local result = {}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  local code = 0
  local state = value and string.sub(value, 1, 1)
  if state == 'L' or state == 'W' then
    local space = string.find(value, ' ', 2, true)
    if not space or owner_at(value, space) ~= ARGV[i + 3] then
      code = -1
    elseif state == 'L' then
      -- The key stays as the token marker, so the next token is larger even if the clock steps
      -- back.
      redis.call('SET', key, 'F' .. string.sub(value, 2, space - 1), 'PX', ARGV[1])
      code = 1
    else
      -- Waited on: the notified waiters have it first for a moment, then anyone.
      local time = redis.call('TIME')
      local until_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
        + tonumber(ARGV[2])
      redis.call('SET', key, 'P' .. string.sub(value, 2, space - 1) .. ' '
        .. string.format('%.0f', until_ms * 1000), 'PX', ARGV[1])
      code = 1
      -- pcall: a refused PUBLISH must not turn a done release into an error reply.
      local published = redis.pcall(ARGV[3], key .. ':released', key)
      if type(published) == 'table' and published.err then
        code = 2
      end
    end
  elseif value and state ~= 'F' and state ~= 'P' and state ~= 'Q' and state ~= 'V' then
    code = -1
  end
  result[i] = code
end
return result
