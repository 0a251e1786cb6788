-- Who holds a lock, for how long, with which token.
--
-- KEYS[1]  lock key (its layout: acquire.lua)
--
-- Returns {owner, fence, pttl} while held, or an empty array when free.
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
if not value or state == 'F' or state == 'P' or state == 'Q' then
  return {}
end
local space = string.find(value, ' ', 2, true)
if (state ~= 'L' and state ~= 'W') or not space then
  return redis.error_reply('DISTLOCK ' .. KEYS[1] .. ' holds a value distlock did not write')
end
return {string.sub(value, space + 1), tonumber(string.sub(value, 2, space - 1)), redis.call('PTTL', KEYS[1])}
