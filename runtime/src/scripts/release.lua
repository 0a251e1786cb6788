-- Release a lock if, and only if, it is still ours; tell waiters it is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  release notification channel of this key
--
-- Returns  1   released (and published on the channel)
--          2   released, but the server refused the notification (the user may not publish on
--              the channel): the release stands, waiters elsewhere learn of it by backoff
--          0   the key is gone: it expired before we released it
--         -1   another owner holds it now: left untouched
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  -- pcall: a refused PUBLISH must not turn a done release into an error reply.
  local published = redis.pcall('PUBLISH', ARGV[2], KEYS[1])
  if type(published) == 'table' and published.err then
    return 2
  end
  return 1
end
if owner then
  return -1
end
return 0
