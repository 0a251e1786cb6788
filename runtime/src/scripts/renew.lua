-- Renew a batch of leases: each key's TTL is reset only if the key is still held by its owner.
--
-- KEYS[i]      lock key i (its layout: acquire.lua)
-- ARGV[2i-1]   owner token of key i
-- ARGV[2i]     new TTL of key i in milliseconds
--
-- Returns an array: element i is 1 when key i was renewed, 0 when it is free, -1 when another
-- owner holds it.
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
local result = {}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  local state = value and string.sub(value, 1, 1)
  if state ~= 'L' and state ~= 'W' then
    result[i] = 0
  else
    local space = string.find(value, ' ', 2, true)
    if space and owner_at(value, space) == ARGV[2 * i - 1] then
      redis.call('PEXPIRE', key, ARGV[2 * i])
      result[i] = 1
    else
      result[i] = -1
    end
  end
end
return result
