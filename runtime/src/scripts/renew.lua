-- Renew a batch of leases: each key's TTL is reset only if the key is still held by its owner.
--
-- KEYS[i]      lock key i
-- ARGV[2i-1]   owner token of key i
-- ARGV[2i]     new TTL of key i in milliseconds
--
-- Returns an array: element i is 1 when key i was renewed, 0 when it is gone, -1 when another
-- owner holds it.
local result = {}
for i, key in ipairs(KEYS) do
  local owner = redis.call('HGET', key, 'owner')
  if owner == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', key, ARGV[2 * i])
    result[i] = 1
  elseif owner then
    result[i] = -1
  else
    result[i] = 0
  end
end
return result
