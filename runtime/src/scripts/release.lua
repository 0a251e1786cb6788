-- Release a lock if, and only if, it is still ours; tell waiters it is free.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner token
-- ARGV[2]  release notification channel of this key
--
-- Returns  1   released (and published on the channel)
--          0   the key is gone: it expired before we released it
--         -1   another owner holds it now: left untouched
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
if owner then
  return -1
end
return 0
