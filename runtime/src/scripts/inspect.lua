-- Who holds a lock, for how long, with which token.
--
-- KEYS[1]  lock key
--
-- Returns {owner, fence, pttl} while held, or an empty array when free.
local owner = redis.call('HGET', KEYS[1], 'owner')
if not owner then
  return {}
end
return {owner, tonumber(redis.call('HGET', KEYS[1], 'fence')), redis.call('PTTL', KEYS[1])}
