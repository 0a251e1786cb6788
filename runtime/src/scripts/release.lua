-- Release a lock if, and only if, it is still ours; tell waiters it is free if anyone waits.
--
-- KEYS[1]  lock key (its layout: acquire.lua)
-- ARGV[1]  owner token
-- ARGV[2]  how long the token marker left in the key lives, in milliseconds
-- ARGV[3]  release notification channel of this key
--
-- Returns  1   released (and, if it was waited on, published on the channel)
--          2   released, but the server refused the notification (the user may not publish on
--              the channel): the release stands, waiters elsewhere learn of it by backoff
--          0   the lock is free: it expired before we released it
--         -1   another owner holds it now: left untouched
local value = redis.call('GET', KEYS[1])
if not value or string.sub(value, 1, 1) == 'F' then
  return 0
end
local space = string.find(value, ' ', 2, true)
if not space or string.sub(value, space + 1) ~= ARGV[1] then
  return -1
end
-- The key stays as the token marker, so the next token is larger even if the clock steps back.
redis.call('SET', KEYS[1], 'F' .. string.sub(value, 2, space - 1), 'PX', ARGV[2])
if string.sub(value, 1, 1) == 'W' then
  -- pcall: a refused PUBLISH must not turn a done release into an error reply.
  local published = redis.pcall('PUBLISH', ARGV[3], KEYS[1])
  if type(published) == 'table' and published.err then
    return 2
  end
end
return 1
