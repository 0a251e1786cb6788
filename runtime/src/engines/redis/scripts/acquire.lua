-- Acquire locks and issue their fencing tokens: one atomic step per key, for a batch of keys
-- (concurrent callers' acquires coalesced into one call; a lone caller sends a batch of one).
--
-- KEYS[i]    lock key i. Its value is one string, so a lock costs one key and one SET:
--              "L<fence> <owner>[ <label>]"  held (the label says who holds it, for operators:
--                                            `hostname:pid` by default; never the owner)
--              "H<fence> <owner>[ <label>]"  held, and only waiters in its queue (below) were
--                                            told it is busy: release hands it over to the
--                                            first (or, in a local batch, transfers it:
--                                            release.lua)
--              "W<fence> <owner>[ <label>]"  held, and someone was told it is busy (release will
--                                            publish, or hand it over and publish)
--              "F<fence>"             free: the last token issued, kept by release for the
--                                     marker TTL
--              "P<fence> <until_us>"  free, and the waiters the release notified have it first
--                                     until server time until_us (a local successor that follows
--                                     the release on its connection must not beat them)
--              "Q<fence> <until_us>"  the same, and someone was turned away meanwhile: a notified
--                                     waiter that takes it holds it as "W", so that its release
--                                     wakes them
--              "V<fence> <until_us>"  the same, freed by the last reader for the writer that
--                                     waits: no reader may take it meanwhile (writers first),
--                                     and the writer holds it as "W" (readers wait behind it)
--
-- KEYS[i]:queue  the processes waiting for a held exclusive lock, in the order they came, each
--               with an entry "<grant ms> <owner>[ ><channel>][ <label>]" that lives for the
--               grant time and is written anew at each of its asks (queue.lua, which starts this
--               script): the holder's release hands the lock over to the first of them
--               (release.lua), in one message, on the waiter's process's handover channel if it
--               names one; while the lock is free, only that waiter may take it
--
-- ARGV[1]    the clock's step in µs for tokens: 1, or 1000 for Redlock, so that masters whose
--            clocks agree to the millisecond vote the same token and the client can skip the
--            write-back round trip; or 0 for locks without tokens (efficiency locks, which every
--            grant writes with token 0 and release.lua deletes)
-- ARGV[2]    the holder label written with every lock ("" for none; no line breaks)
-- ARGV[3]    the grant time, in milliseconds: how long a lock handed over to a waiter is held
--            before its new owner confirms it, which is also how long a waiter's place in the
--            queue lasts without it asking again; "0": never queue (the in-process engine,
--            whose waiters are all in one process and wait in its local turns).
--            Followed by " <channel>" where the caller's process has a handover channel of its
--            own (release.lua announces a handover to it there, not on the key's channel)
-- ARGV[3i+1] owner token of key i (new for every acquisition; no spaces)
-- ARGV[3i+2] lease TTL of key i in milliseconds
-- ARGV[3i+3] who asks for key i: "0" a single try (a busy reply is final: the lock is not marked
--            waited on), "1" the first try of a caller that waits when it is busy, "2" a caller
--            told it is busy before (a waiter, notified or backing off), which has the lock
--            first while a release's "P" marker lasts; followed by " <ticket>" where the caller
--            brings its place in line (Redlock: the same on every master), else it queues
--            behind everyone queued
--
-- Returns a flat array, two elements per key:
--   1, fence    acquired (or already ours: an idempotent retry refreshes the TTL and returns the
--               token issued the first time — which is how a handed-over lock is confirmed)
--   0, pttl     held by another owner, which keeps it for pttl more milliseconds; the lock is
--               marked as waited on (unless the caller tries once), so its release announces
--               itself
--   4, pttl     the same, and the caller is in the lock's queue (KEYS[i]:queue), in the place
--               it had: a release hands the lock to it when its turn comes; or the lock is free,
--               and the first waiter of the queue has it for pttl more milliseconds (unless it
--               takes it or asks again), the caller behind
--   7, pttl     the same as 4, the caller queued at the back with a new place: it had none that
--               lived (a first ask; or its place lapsed, or a lock handed to it lapsed unclaimed)
--   3, left     free, but left to the waiters a release notified for `left` more milliseconds
--               (the caller is not one of them: it waits that long, or for a notification)
--  -2, 0        the key holds a value distlock did not write (another program uses the name)
--  -3, 0        the key is a semaphore (shared_acquire.lua), not a lock
--
-- Readers (shared_acquire.lua) hold a key as "R<fence>"/"S<fence> <until_us>", their leases in
-- the sorted set KEYS[i]:holders. A writer finding live readers is busy, and (unless it tries
-- once) turns the value into "S…" with a writer intent of WRITER_INTENT_MS: new readers queue
-- behind it until then, and each try of the waiting writer renews it — writers never starve.
-- The key lives at least as long as the intent. Readers whose leases all expired are no
-- obstacle: the key counts as free.
--
-- Fencing tokens are max(last + 1, server time in µs), `last` being the token a release left in
-- the key. The marker keeps tokens increasing when the server clock steps back; the clock keeps them
-- increasing once the marker is gone (or the lock expired instead of being released), which is what
-- bounds memory. Both stay exact as Lua doubles below 2^53 (about 285 years of µs). Numbers are
-- written with string.format('%.0f') (tostring() keeps only 14 significant digits), except a token
-- taken from the clock, which is TIME's digits as they are and costs less.
local step = tonumber(ARGV[1])
local WRITER_INTENT_MS = 500
local label = ARGV[2] ~= '' and ' ' .. ARGV[2] or ''
local channel_at = string.find(ARGV[3], ' ', 1, true)
local grant_time_ms = tonumber(string.sub(ARGV[3], 1, (channel_at or 0) - 1))
local channel = channel_at and ' >' .. string.sub(ARGV[3], channel_at + 1) or ''
-- A label that starts with '>' would read as a channel: an empty channel goes before it.
if channel == '' and string.sub(label, 1, 2) == ' >' then
  channel = ' >'
end
-- The owner token: after the first space, up to the next one (the holder label follows it).
local function owner_at(value, space)
  local stop = string.find(value, ' ', space + 1, true)
  return string.sub(value, space + 1, (stop or 0) - 1)
end
-- Queues `owner`, which asks for `key` with a lease of `ttl` ms, at `ticket` ("": behind
-- everyone queued), its entry naming its grant time, its process's handover channel and its
-- label: the code to answer, 4 (its place kept) or 7 (a new place); nil when the queue is full.
local function queue_up(key, owner, ttl, ticket)
  local grant_ms = math.min(grant_time_ms, tonumber(ttl))
  local joined = queue().join(key, owner, grant_ms .. ' ' .. owner .. channel .. label,
    grant_ms, ticket ~= '' and ticket or nil)
  if joined then
    return joined == 'kept' and 4 or 7
  end
end
local time, now
local function server_time()
  if not time then
    time = redis.call('TIME')
  end
  return time
end
local function clock()
  if not now then
    now = tonumber(server_time()[1]) * 1000000 + tonumber(server_time()[2])
  end
  return now
end
-- The clock in µs rounded down to the step, as decimal digits: TIME's own digits, joined
-- (string.format of a large double is the costliest step of a fresh key's acquire).
local function clock_digits()
  local seconds, micros = server_time()[1], server_time()[2]
  micros = string.rep('0', 6 - #micros) .. micros
  if step == 1 then
    return seconds .. micros
  end
  return seconds .. string.sub(micros, 1, 3) .. '000'
end
local result = {}
for i, key in ipairs(KEYS) do
  local owner, ttl, asker = ARGV[3 * i + 1], ARGV[3 * i + 2], ARGV[3 * i + 3]
  local ticket = ''
  if #asker > 1 then
    ticket, asker = string.sub(asker, 3), string.sub(asker, 1, 1)
  end
  local value = redis.call('GET', key)
  local last = 0
  local held_as = 'L'
  local code, answer
  if value then
    local state = string.sub(value, 1, 1)
    local space = string.find(value, ' ', 2, true)
    if state == 'F' then
      last = tonumber(string.sub(value, 2)) or 0
    elseif state == 'M' or state == 'N' then
      code, answer = -3, 0
    elseif state == 'R' or state == 'S' then
      last = tonumber(string.sub(value, 2, (space or 0) - 1)) or 0
      local holders = key .. ':holders'
      local now_ms = math.floor(clock() / 1000)
      redis.call('ZREMRANGEBYSCORE', holders, '-inf', now_ms)
      if redis.call('ZCARD', holders) > 0 then
        if asker ~= '0' then
          local intent = string.format('%.0f', clock() + WRITER_INTENT_MS * 1000)
          redis.call('SET', key, 'S' .. string.format('%.0f', last) .. ' ' .. intent, 'KEEPTTL')
          -- The intent outlives readers whose leases run out first (a reader that crashed).
          if redis.call('PTTL', key) < WRITER_INTENT_MS then
            redis.call('PEXPIRE', key, WRITER_INTENT_MS)
          end
        end
        code, answer = 0, redis.call('PTTL', key)
      else
        redis.call('DEL', holders)
        -- Readers turned away by the intent wait for this writer's release: announce it.
        if state == 'S' then
          held_as = 'W'
        end
      end
    elseif (state == 'P' or state == 'Q' or state == 'V') and space then
      last = tonumber(string.sub(value, 2, space - 1)) or 0
      local left_ms = math.ceil((tonumber(string.sub(value, space + 1)) - clock()) / 1000)
      if left_ms > 0 then
        if asker == '2' then
          if state ~= 'P' then
            held_as = 'W'
          end
        else
          if state == 'P' and asker == '1' then
            redis.call('SETRANGE', key, 0, 'Q')
          end
          code, answer = 3, left_ms
        end
      end
    elseif (state ~= 'L' and state ~= 'W' and state ~= 'H') or not space then
      code, answer = -2, 0
    elseif owner_at(value, space) == owner then
      redis.call('PEXPIRE', key, ttl)
      code, answer = 1, tonumber(string.sub(value, 2, space - 1))
    else
      code, answer = 0, redis.call('PTTL', key)
      if grant_time_ms > 0 and asker ~= '0' then
        code = queue_up(key, owner, ttl, ticket) or 0
      end
      -- Marked as waited on: by queued waiters alone ("H": release hands it over, and the new
      -- holder's release publishes nothing unless someone else asked meanwhile), or by anyone
      -- else ("W": release publishes).
      if code ~= 0 then
        if state == 'L' then
          redis.call('SETRANGE', key, 0, 'H')
        end
      elseif state ~= 'W' and asker ~= '0' then
        redis.call('SETRANGE', key, 0, 'W')
      end
    end
  end
  if not code and grant_time_ms > 0 and queue_exists(key) then
    -- Free, but waiters may be queued (its holder expired, or the waiter it was handed to never
    -- claimed it): the first of them takes it, the others wait behind.
    local head = queue().head(key)
    if head == owner then
      -- Its turn. A Redlock waiter (it brings a ticket) keeps its place until its call ends: a
      -- vote it gives back after a failed attempt leaves it first in line here.
      if ticket == '' then
        queue().pop(key, owner)
      end
      if held_as == 'L' and queue().anyone(key) then
        held_as = 'H'
      end
    elseif head then
      code, answer = 0, redis.call('PTTL', key .. ':queue:' .. head)
      if asker ~= '0' then
        code = queue_up(key, owner, ttl, ticket) or 0
      end
    end
  end
  if not code then
    -- max(last + 1, the clock): the clock's own digits whenever it is ahead, which is almost
    -- always (formatting a double costs more than the rest of a fresh key's acquire).
    local fence = step == 0 and '0' or clock_digits()
    if step ~= 0 and tonumber(fence) <= last then
      fence = string.format('%.0f', last + 1)
    end
    redis.call('SET', key, held_as .. fence .. ' ' .. owner .. label, 'PX', ttl)
    code, answer = 1, tonumber(fence)
  end
  result[2 * i - 1] = code
  result[2 * i] = answer
end
return result
