-- Record a fencing token granted by a quorum (Redlock) on one master, so that every later quorum
-- meets a master that knows it: the token becomes the lock's token here (and, after the release,
-- the marker's) — only where the lock is still ours.
--
-- KEYS[1]  lock key (its layout: acquire.lua)
-- ARGV[1]  owner token (a reader: "~<owner> <label>")
-- ARGV[2]  the granted fencing token (an integer below 2^53, at least this master's vote)
--
-- Returns 1  recorded
--         0  the lock is not ours here (expired, released, taken): nothing written
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
local value = redis.call('GET', KEYS[1])
local state = value and string.sub(value, 1, 1)
if string.sub(ARGV[1], 1, 1) == '~' then
  -- A reader ("~<owner> <label>", its member of KEYS[1]:holders): the read-held key's token
  -- becomes at least the granted one, so every later writer's vote here exceeds it.
  local expiry = redis.call('ZSCORE', KEYS[1] .. ':holders', string.sub(ARGV[1], 2))
  local time = redis.call('TIME')
  local now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  -- Only a reader whose lease is still live records its token.
  if (state ~= 'R' and state ~= 'S') or not expiry or tonumber(expiry) <= now_ms then
    return 0
  end
  local stop = string.find(value, ' ', 2, true)
  local fence = tonumber(string.sub(value, 2, (stop or 0) - 1))
  local granted = tonumber(ARGV[2])
  if granted > fence then
    local rest = stop and string.sub(value, stop) or ''
    redis.call('SET', KEYS[1], state .. string.format('%.0f', granted) .. rest, 'KEEPTTL')
  end
  return 1
end
if state ~= 'L' and state ~= 'W' and state ~= 'H' then
  return 0
end
local space = string.find(value, ' ', 2, true)
if not space or owner_at(value, space) ~= ARGV[1] then
  return 0
end
-- The state letter, the new token, then the owner and label as they were.
redis.call('SET', KEYS[1], string.sub(value, 1, 1) .. ARGV[2] .. string.sub(value, space), 'KEEPTTL')
return 1
