-- Release locks if, and only if, each is still ours; tell waiters a lock is free if anyone waits.
-- A batch of keys (concurrent callers' releases coalesced into one call; a lone caller sends a
-- batch of one).
--
-- KEYS[i]    lock key i (its layout: acquire.lua); its notification channel is KEYS[i]:released
-- ARGV[1]    how long the token marker left in a released key lives, in milliseconds; or 0 for
--            locks without tokens (efficiency locks: acquire.lua's clock step 0): a release
--            then deletes the key, a handover or transfer grants token 0, and a reservation
--            for notified waiters lives only for its window
-- ARGV[2]    how long the waiters a release notifies have the lock first, in milliseconds
-- ARGV[3]    the command that announces a release: PUBLISH, or SPUBLISH (sharded pub/sub, on
--            the node owning the key's slot, in a Redis Cluster)
-- ARGV[4]    this process's handover channel ("" for none): where a handover to a successor it
--            queues (below) is announced
-- ARGV[5]    "1": a waited-on lock is handed over to the first queued waiter (below); "0": its
--            waiters are told it is free instead, and the first queued one takes it by asking
--            (Redlock's masters, which must each grant the same caller)
-- ARGV[i+5]  owner token of key i, or "<owner> <successor> <successor ttl ms> <grant ms>[ +]"
--            to transfer the lock to a task of the same process queued behind this holder (a
--            local transfer), or, if it is handed over, to queue that task for it ("+": the
--            transfer may go ahead of other processes' queued waiters); or
--            "<owner> <successor> 0" to release the lock if either token holds it, after a
--            transfer whose outcome its releaser never learnt (and give up either's place in the
--            queue); or "<owner> =" to release the lock if the owner holds it and keep the
--            owner's place in the queue (a Redlock vote given back after a failed attempt)
--
-- A local transfer rewrites a lock nobody else was told is busy ("L") as the successor's, with
-- the next token and the successor's TTL, and the holder label of the lock it replaces (the
-- same process's) — one script per local transfer instead of a release and an acquire. So does
-- a lock only queued waiters were told is busy ("H") when the transfer may go ahead of them
-- ("+": the process's run of holders in a row is short, BackendBuilder::local_batch); it stays
-- "H", and the queue keeps its order. A lock others wait for ("W", or "H" without "+") is
-- released as if no successor were named: the waiters of other processes come first. Handed
-- over to the first queued waiter, the lock gets the successor at the back of its queue, with
-- the grant time given (the entry the successor's first ask would have written): the
-- successor waits for its handover without asking, and processes take the lock in turns, one
-- message each. Otherwise the successor asks for the lock like any waiter. A transfer tried
-- again after a lost reply finds the lock the successor's, and a handover that queued it finds
-- it queued: each answers as the first one did.
--
-- An owner that does not hold the lock (an ended waiting call releasing whatever it may hold)
-- leaves the queue.
--
-- A waited-on lock with a queued waiter whose entry lives (KEYS[i]:queue, queue.lua) is handed
-- over to the first such waiter: the key becomes its lock (a new token) for the waiter's grant
-- time, "L…" if nobody else waits, "H…" if others are queued, "W…" if someone unqueued was told
-- it is busy ("W"), and "G<fence> <owner>" is published — on the waiter's process's handover
-- channel as "G<fence> <owner> <key's channel>" if its entry names one, else on the key's
-- channel (read by every process waiting for the key). The waiter holds it from that message
-- on, and confirms it by renewing it (its TTL then becomes the waiter's own). An "H" lock whose
-- queued waiters all stopped asking is released as a "W" one.
--
-- Returns an array, one element per key:
--   1   released (and, if it was waited on, published on the channel)
--   2   released, but the server refused the notification (the user may not publish on the
--       channel): the release stands, waiters elsewhere learn of it by backoff
--   3   released and handed over to the first queued waiter (published, unless the server
--       refused: the waiter then finds it its own when it next asks)
--   6   the same, and the successor named is queued for the handed-over lock
--   0   the lock is free: it expired before we released it
--  -1   another owner holds it now (or another program wrote the key): left untouched
--  {5, fence}  transferred to the successor, which holds it with this token
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
-- A queued waiter's entry (queue.lua) after its owner token (at `from`, a space or the end): its
-- process's handover channel (nil for none: no field, or an empty one, written before a label
-- that starts with '>') and its holder label with the space before it ("" for none).
local function channel_and_label(waiter, from)
  if string.sub(waiter, from, from + 1) ~= ' >' then
    return nil, string.sub(waiter, from)
  end
  local stop = string.find(waiter, ' ', from + 2, true)
  local channel = string.sub(waiter, from + 2, (stop or 0) - 1)
  return channel ~= '' and channel or nil, stop and string.sub(waiter, stop) or ''
end
-- The next fencing token after `last`: max(last + 1, the clock in µs), as acquire.lua issues
-- them — TIME's own digits whenever the clock is ahead (cheaper than formatting a double).
local unfenced = ARGV[1] == '0'
local function next_fence(last)
  if unfenced then
    return '0'
  end
  local time = redis.call('TIME')
  local fence = time[1] .. string.rep('0', 6 - #time[2]) .. time[2]
  if tonumber(fence) <= last then
    fence = string.format('%.0f', last + 1)
  end
  return fence
end
local result = {}
for i, key in ipairs(KEYS) do
  local owner, successor, successor_ttl, successor_grant = ARGV[i + 5], nil, nil, nil
  local ahead = false
  local keeps_place = string.sub(owner, -2) == ' ='
  if keeps_place then
    owner = string.sub(owner, 1, -3)
  end
  local split = string.find(owner, ' ', 1, true)
  if split then
    local ttl_at = string.find(owner, ' ', split + 1, true)
    local grant_at = string.find(owner, ' ', ttl_at + 1, true)
    local ahead_at = grant_at and string.find(owner, ' ', grant_at + 1, true)
    successor = string.sub(owner, split + 1, ttl_at - 1)
    successor_ttl = string.sub(owner, ttl_at + 1, (grant_at or 0) - 1)
    successor_grant = grant_at and string.sub(owner, grant_at + 1, (ahead_at or 0) - 1)
    ahead = ahead_at ~= nil
    owner = string.sub(owner, 1, split - 1)
  end
  -- A successor with no TTL names a transfer that may have run: the lock is released as either
  -- token's, and nothing is transferred.
  local pledged
  if successor_ttl == '0' then
    pledged, successor = successor, nil
  end
  local value = redis.call('GET', key)
  local code = 0
  local state = value and string.sub(value, 1, 1)
  if state == 'L' or state == 'W' or state == 'H' then
    local space = string.find(value, ' ', 2, true)
    local holder = space and owner_at(value, space)
    if pledged and holder == pledged then
      owner = holder
    end
    if successor and holder == successor then
      -- Transferred already: this is a retry after a lost reply.
      code = {5, tonumber(string.sub(value, 2, space - 1))}
    elseif holder ~= owner then
      code = -1
      -- The pledged token is this release's alone: queued, it says that a handover of this
      -- release ran. Tried again after a lost reply, the handover answers as the first time;
      -- released after a transfer whose outcome was never learnt, the lock counts as released,
      -- and the successor's place is given up.
      if successor_grant and queue().has(key, successor) then
        code = 6
      elseif pledged and queue().leave(key, pledged) then
        code = 1
      end
    elseif successor and (state == 'L' or (state == 'H' and ahead)) then
      local label_at = string.find(value, ' ', space + 1, true)
      local fence = next_fence(tonumber(string.sub(value, 2, space - 1)) or 0)
      redis.call('SET', key, state .. fence .. ' ' .. successor
        .. (label_at and string.sub(value, label_at) or ''), 'PX', successor_ttl)
      code = {5, tonumber(fence)}
    elseif state == 'L' and unfenced then
      redis.call('DEL', key)
      code = 1
    elseif state == 'L' then
      -- The key stays as the token marker, so the next token is larger even if the clock steps
      -- back.
      redis.call('SET', key, 'F' .. string.sub(value, 2, space - 1), 'PX', ARGV[1])
      code = 1
    else
      -- Waited on: handed over to the first queued waiter whose entry lives, if any.
      local heir, entry
      if ARGV[5] == '1' then
        heir, entry = queue().head(key)
      end
      if heir then
        queue().pop(key, heir)
        local fence = next_fence(tonumber(string.sub(value, 2, space - 1)) or 0)
        code = 3
        if successor_grant then
          -- The successor queues at the back, labelled as this holder (same process).
          local label_at = string.find(value, ' ', space + 1, true)
          local label = label_at and string.sub(value, label_at) or ''
          local channel = ARGV[4] ~= '' and ' >' .. ARGV[4]
            or (string.sub(label, 1, 2) == ' >' and ' >' or '')
          if queue().join(key, successor, successor_grant .. ' ' .. successor .. channel .. label,
              successor_grant) then
            code = 6
          end
        end
        local held_as = 'W'
        if state == 'H' then
          held_as = queue().anyone(key) and 'H' or 'L'
        end
        local split = string.find(entry, ' ', 1, true)
        local channel, label = channel_and_label(entry, split + 1 + #heir)
        redis.call('SET', key, held_as .. fence .. ' ' .. heir .. label, 'PX',
          string.sub(entry, 1, split - 1))
        -- pcall: refused, the grant stands all the same (the waiter finds it when it asks).
        if channel then
          redis.pcall(ARGV[3], channel, 'G' .. fence .. ' ' .. heir .. ' ' .. key .. ':released')
        else
          redis.pcall(ARGV[3], key .. ':released', 'G' .. fence .. ' ' .. heir)
        end
      else
        -- The notified waiters have it first for a moment, then anyone.
        local time = redis.call('TIME')
        local until_ms = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
          + tonumber(ARGV[2])
        -- Without tokens, nothing outlives the reservation.
        local marker_ms = unfenced and math.max(tonumber(ARGV[2]), 1) or ARGV[1]
        redis.call('SET', key, 'P' .. string.sub(value, 2, space - 1) .. ' '
          .. string.format('%.0f', until_ms * 1000), 'PX', marker_ms)
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
  if not keeps_place and (ARGV[5] == '0' or (type(code) == 'number' and code <= 0)) then
    -- Not ours to release: the owner may be a waiting call that ended (cancelled, out of time),
    -- which must not stay queued (nor may a successor queued by a handover whose outcome its
    -- releaser never learnt). On Redlock's masters a holder stays queued until its call ends:
    -- this release.
    queue().leave(key, owner)
    if pledged then
      queue().leave(key, pledged)
    end
  end
  result[i] = code
end
return result
