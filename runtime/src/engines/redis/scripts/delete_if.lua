-- Release efficiency locks (no fencing tokens: node/efficiency.rs) that were granted on their
-- callers' first tries and that nobody was told are busy since: each key still holds exactly
-- the value its grant wrote, "L0 <owner>[ <label>]", and is deleted. Anything else is left for
-- release.lua, which tells what happened and wakes the waiters.
--
-- KEYS[i]  lock key i
-- ARGV[i]  the value key i was granted with
--
-- Returns an array: element i is 1 when key i was deleted, 0 when it holds something else
-- (waited on, expired, taken over).
local result = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then
    result[i] = redis.call('DEL', key)
  else
    result[i] = 0
  end
end
return result
