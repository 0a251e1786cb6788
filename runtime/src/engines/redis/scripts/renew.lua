-- Renew a batch of leases: each key's TTL is reset only if the key is still held by its owner.
--
-- KEYS[i]      lock key i (its layout: acquire.lua)
-- ARGV[2i-1]   owner token of key i; for a shared holder (a reader, a permit:
--              shared_acquire.lua) "~<owner> <label>", its member of KEYS[i]:holders
-- ARGV[2i]     new TTL of key i in milliseconds
--
-- Returns an array: element i is 1 when key i was renewed, 0 when it is free, -1 when another
-- owner holds it.
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
local now_ms
local function clock_ms()
  if not now_ms then
    local time = redis.call('TIME')
    now_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
  end
  return now_ms
end
local result = {}
for i, key in ipairs(KEYS) do
  local value = redis.call('GET', key)
  local state = value and string.sub(value, 1, 1)
  local owner = ARGV[2 * i - 1]
  if string.sub(owner, 1, 1) == '~' then
    -- A shared holder (shared_acquire.lua): "~<owner> <label>", its lease in KEYS[i]:holders.
    local holders = key .. ':holders'
    local member = string.sub(owner, 2)
    local expiry = redis.call('ZSCORE', holders, member)
    local ttl = tonumber(ARGV[2 * i])
    if state == 'L' or state == 'W' or state == 'H' then
      -- A writer holds the key now: this reader's lease is gone, and someone else has it.
      result[i] = -1
    elseif expiry and tonumber(expiry) > clock_ms() and string.find('RSMN', state or '-', 1, true) then
      redis.call('ZADD', holders, clock_ms() + ttl, member)
      if redis.call('PTTL', key) < ttl then
        redis.call('PEXPIRE', key, ttl)
        redis.call('PEXPIRE', holders, ttl)
      end
      result[i] = 1
    else
      result[i] = 0
    end
  elseif state ~= 'L' and state ~= 'W' and state ~= 'H' then
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
