-- Release locks if, and only if, each is still ours; tell waiters a lock is free if anyone waits.
-- A batch of keys (concurrent callers' releases coalesced into one call; a lone caller sends a
-- batch of one).
--
-- KEYS[i]    lock key i (its layout: acquire.lua); its notification channel is KEYS[i]:released
-- ARGV[1]    how long the token marker left in a released key lives, in milliseconds
-- ARGV[2]    how long the waiters a release notifies have the lock first, in milliseconds
-- ARGV[3]    the command that announces a release: PUBLISH, or SPUBLISH (sharded pub/sub, on
--            the node owning the key's slot, in a Redis Cluster)
-- ARGV[i+3]  owner token of key i
--
-- An owner that does not hold the lock (an ended waiting call releasing whatever it may hold)
-- stops being its next waiter.
--
-- A waited-on lock with a next waiter (KEYS[i]:next, acquire.lua) is handed over to it: the key
-- becomes its lock (a new token) for the waiter's grant time, "L…" if only that waiter waited
-- ("H"), "W…" if others did too, and the channel carries "G<fence> <owner>" — the waiter holds
-- it from that message on, and confirms it by renewing it (its TTL then becomes the waiter's
-- own). An "H" lock whose next waiter stopped asking is released as a "W" one.
--
-- Returns an array, one element per key:
--   1   released (and, if it was waited on, published on the channel)
--   2   released, but the server refused the notification (the user may not publish on the
--       channel): the release stands, waiters elsewhere learn of it by backoff
--   3   released and handed over to the next waiter (published, unless the server refused:
--       the waiter then finds it its own when it next asks)
--   0   the lock is free: it expired before we released it
--  -1   another owner holds it now (or another program wrote the key): left untouched
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
-- `key`'s next waiter (acquire.lua): its record "<grant ms> <owner>[ <label>]" and where the
-- record's first space is, or nil when none is recorded.
local function next_waiter(key)
  local waiter = redis.call('GET', key .. ':next')
  local split = waiter and string.find(waiter, ' ', 1, true)
  if split then
    return waiter, split
  end
end
local result = {}
for i, key in ipairs(KEYS) do
  local owner = ARGV[i + 3]
  local value = redis.call('GET', key)
  local code = 0
  local state = value and string.sub(value, 1, 1)
  if state == 'L' or state == 'W' or state == 'H' then
    local space = string.find(value, ' ', 2, true)
    if not space or owner_at(value, space) ~= owner then
      code = -1
    elseif state == 'L' then
      -- The key stays as the token marker, so the next token is larger even if the clock steps
      -- back.
      redis.call('SET', key, 'F' .. string.sub(value, 2, space - 1), 'PX', ARGV[1])
      code = 1
    else
      -- Waited on. "<grant ms> <owner>[ <label>]": the next waiter, if one still asks.
      local waiter, split = next_waiter(key)
      if waiter and owner_at(waiter, split) ~= owner then
        -- Handed over: the waiter's lock, with the next token.
        redis.call('DEL', key .. ':next')
        local time = redis.call('TIME')
        local now_us = tonumber(time[1]) * 1000000 + tonumber(time[2])
        local last = tonumber(string.sub(value, 2, space - 1)) or 0
        local fence = string.format('%.0f', math.max(last + 1, now_us))
        local held_as = state == 'H' and 'L' or 'W'
        redis.call('SET', key, held_as .. fence .. ' ' .. string.sub(waiter, split + 1), 'PX',
          string.sub(waiter, 1, split - 1))
        code = 3
        -- pcall: refused, the grant stands all the same (the waiter finds it when it asks).
        redis.pcall(ARGV[3], key .. ':released', 'G' .. fence .. ' ' .. owner_at(waiter, split))
      else
        -- The notified waiters have it first for a moment, then anyone.
        local time = redis.call('TIME')
        local until_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
          + tonumber(ARGV[2])
        redis.call('SET', key, 'P' .. string.sub(value, 2, space - 1) .. ' '
          .. string.format('%.0f', until_ms * 1000), 'PX', ARGV[1])
        code = 1
        -- pcall: a refused PUBLISH must not turn a done release into an error reply.
        local published = redis.pcall(ARGV[3], key .. ':released', key)
        if type(published) == 'table' and published.err then
          code = 2
        end
      end
    end
  elseif value and state ~= 'F' and state ~= 'P' and state ~= 'Q' and state ~= 'V' then
    code = -1
  end
  if code <= 0 then
    -- Not ours to release: the owner may be a waiting call that ended (cancelled, out of time),
    -- which must not stay the lock's next waiter.
    local waiter, split = next_waiter(key)
    if waiter and owner_at(waiter, split) == owner then
      redis.call('DEL', key .. ':next')
    end
  end
  result[i] = code
end
return result
