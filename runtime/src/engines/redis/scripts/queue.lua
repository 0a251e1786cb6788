-- The queue of processes waiting for a held exclusive lock. This file is the start of
-- acquire.lua and release.lua (scripts/mod.rs joins them), which keep the queue; nothing else
-- writes it.
--
-- <lock>:queue          the waiters, one per waiting process (the task that contends for the
--                       key on the process's behalf), at most QUEUE_BOUND: a sorted set of owner
--                       tokens scored by their place in line — behind everyone queued when they
--                       joined (one server), or the ticket the waiter brings (Redlock: the same
--                       on every master, so that the masters' queues agree)
-- <lock>:queue:<owner>  that waiter's entry, "<grant ms> <owner>[ ><channel>][ <label>]": the
--                       grant time (how long a lock handed over to it stays unclaimed before it
--                       lapses, and how long the entry lives without the waiter asking again),
--                       its process's handover channel and its holder label. Written anew, for
--                       the grant time (PX), each time the waiter asks: a waiter that stopped
--                       asking (dead, paused, cut off) loses its place when its entry lapses, and
--                       joins at the back if it asks again.
--
-- The set lives as long as its longest-living entry (its TTL is raised at every entry written),
-- and an emptied set is gone: nothing is left on the server once the last waiter leaves. A
-- release hands the lock to the first waiter whose entry lives (release.lua); while the lock is
-- free, only that waiter may take it (acquire.lua). A lapsed entry is skipped where it is met.
local QUEUE_BOUND = 1024

-- Whether anyone may be queued for `lock`: the one command a free key's acquire pays for the
-- queue when nobody waits.
local function queue_exists(lock)
  return redis.call('EXISTS', lock .. ':queue') == 1
end

local queue_functions
-- The queue's functions, made on first use: an uncontended acquire or release never needs
-- them, and making them costs a closure each per script run.
local function queue()
  if queue_functions then
    return queue_functions
  end
  local q = {}

  -- The first waiter of `lock`'s queue whose entry lives, with its entry; the waiters before
  -- it, whose entries lapsed, leave the queue. nil when nobody waits.
  function q.head(lock)
    local set = lock .. ':queue'
    while true do
      local head = redis.call('ZRANGE', set, 0, 0)[1]
      if not head then
        return nil
      end
      local entry = redis.call('GET', set .. ':' .. head)
      if entry then
        return head, entry
      end
      redis.call('ZREM', set, head)
    end
  end

  -- Keeps the set at least as long as an entry written for `grant_ms`.
  local function lives(set, grant_ms)
    if redis.call('PTTL', set) < tonumber(grant_ms) then
      redis.call('PEXPIRE', set, grant_ms)
    end
  end

  -- Records `owner` as waiting for `lock`, its entry `entry` for `grant_ms`: at `ticket`
  -- (digits) if given — its place then is the ticket's, whatever it was (Redlock: every master
  -- moves the waiter to the same place, so their queues agree) —, else in its place if its
  -- entry lives, or behind everyone queued. 'kept' when its entry lived, 'joined' when it had
  -- none, false when the queue is full.
  function q.join(lock, owner, entry, grant_ms, ticket)
    local set = lock .. ':queue'
    local kept = redis.call('SET', set .. ':' .. owner, entry, 'PX', grant_ms, 'XX')
    if not kept then
      if redis.call('ZCARD', set) >= QUEUE_BOUND then
        return false
      end
      if not ticket then
        local last = redis.call('ZRANGE', set, -1, -1, 'WITHSCORES')[2]
        ticket = string.format('%.0f', (tonumber(last) or 0) + 1)
      end
      redis.call('SET', set .. ':' .. owner, entry, 'PX', grant_ms)
    end
    if ticket then
      redis.call('ZADD', set, ticket, owner)
    end
    lives(set, grant_ms)
    return kept and 'kept' or 'joined'
  end

  -- `owner` leaves `lock`'s queue, if it is in it (an ended waiting call). true when it was.
  function q.leave(lock, owner)
    local set = lock .. ':queue'
    if redis.call('DEL', set .. ':' .. owner) == 1 then
      redis.call('ZREM', set, owner)
      return true
    end
    return false
  end

  -- Whether `owner`'s entry in `lock`'s queue lives.
  function q.has(lock, owner)
    return redis.call('EXISTS', lock .. ':queue:' .. owner) == 1
  end

  -- Whether anyone is in `lock`'s queue (entries not checked: a lapsed one is skipped when
  -- met).
  function q.anyone(lock)
    return redis.call('ZCARD', lock .. ':queue') > 0
  end

  -- The head of the queue, which q.head returned, leaves it to take the lock.
  function q.pop(lock, head)
    redis.call('ZREM', lock .. ':queue', head)
    redis.call('DEL', lock .. ':queue:' .. head)
  end

  queue_functions = q
  return q
end

