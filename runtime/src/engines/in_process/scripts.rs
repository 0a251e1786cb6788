//! The lock scripts' transitions, in Rust, on the in-process [`Keyspace`]: each function here is
//! the `.lua` file of the same name (`engines/redis/scripts/`), step for step, reading and
//! writing the same values (`engines/redis/protocol`) and answering the same replies.
//! `tests/protocol.rs` drives both with the same random operations and compares them after
//! every step.

use super::keyspace::{Keyspace, Ttl};
use crate::engines::engine::Asker;
use crate::engines::redis::protocol::{
    millis, Acquire, LockValue, Release, Renew, SharedAcquire, SharedRelease, State,
};
use crate::lock::key::{channel_of, holders_of};
use crate::lock::kind::WRITER_INTENT;
use std::ops::ControlFlow;

/// The queue's bound (`queue.lua`'s `QUEUE_BOUND`).
const QUEUE_BOUND: usize = 1024;

/// What every call of a script shares (the arguments before the per-key ones).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The holder label written with every lock ("" for none).
    pub(crate) label: String,
    /// The grant time in ms; 0: waiters do not queue (`acquire.lua`'s `ARGV[3]`).
    pub(crate) grant_ms: u64,
    /// How long a release's token marker lives, in ms.
    pub(crate) marker_ttl_ms: u64,
    /// Exclusive locks carry fencing tokens; `false`: efficiency locks, granted with token 0
    /// and deleted by their release (`acquire.lua`'s clock step 0, `release.lua`'s marker TTL 0).
    pub(crate) fenced: bool,
    /// How long the waiters a release notifies have the lock first, in ms.
    pub(crate) window_ms: u64,
    /// A waited-on lock is handed over to the first queued waiter (`release.lua`'s `ARGV[5]`).
    pub(crate) hands_over: bool,
    /// A known-bad transition in place of the right one: the model checker (`tests/model`)
    /// turns one on to see its properties fail.
    #[cfg(distlock_test_hooks)]
    pub(crate) mutation: Option<Mutation>,
}

/// The known-bad transitions the model checker re-introduces (`tests/model`); public through
/// the test hooks only.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(distlock_test_hooks), allow(unreachable_pub))]
pub enum Mutation {
    /// The queue records only its first waiter: the others are told "busy" and poll.
    FirstWaiterOnly,
    /// A release frees (or hands over) the lock whoever holds it.
    ReleaseIgnoresOwner,
}

/// Whether the model checker turned `mutation` on (never, outside the test hooks).
#[allow(unused_variables)]
fn mutated(settings: &Settings, mutation: Mutation) -> bool {
    #[cfg(distlock_test_hooks)]
    return settings.mutation == Some(mutation);
    #[cfg(not(distlock_test_hooks))]
    false
}

/// The messages a script published, in order: (channel, message).
pub(crate) type Published = Vec<(String, String)>;

/// Who asks for a lock (`acquire.lua`'s per-key `ARGV[3i+3]`, whose `'0'`, `'1'` and `'2'` are
/// [`Asker::Once`], [`Asker::WillWait`] and [`Asker::Waiting`]), with the waiter's ticket, if it
/// brings one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asking {
    pub(crate) asker: Asker,
    pub(crate) ticket: Option<u64>,
}

/// One key of an acquire.
#[derive(Debug, Clone)]
pub(crate) struct AcquireCall {
    pub(crate) lock: String,
    pub(crate) owner: String,
    pub(crate) ttl_ms: u64,
    pub(crate) asking: Asking,
}

/// One key of a release (`release.lua`'s per-key argument).
#[derive(Debug, Clone, Default)]
pub(crate) struct ReleaseCall {
    pub(crate) lock: String,
    pub(crate) owner: String,
    /// A local successor: its token, TTL (0: a transfer that may have run, released as either
    /// token's), and, where waiters queue, its grant time and whether it may go ahead.
    pub(crate) successor: Option<(String, u64, Option<u64>, bool)>,
    /// Keep the owner's place in the queue (a Redlock vote given back).
    pub(crate) keeps_place: bool,
}

fn queue_of(lock: &str) -> String {
    format!("{lock}:queue")
}

fn entry_of(lock: &str, owner: &str) -> String {
    format!("{lock}:queue:{owner}")
}

// --- queue.lua ---

fn queue_exists(keys: &mut Keyspace, lock: &str) -> bool {
    keys.exists(&queue_of(lock))
}

/// The first waiter whose entry lives, with its entry; lapsed ones before it leave.
fn queue_head(keys: &mut Keyspace, lock: &str) -> Option<(String, String)> {
    let queue = queue_of(lock);
    loop {
        let (head, _) = keys.zfirst(&queue)?;
        if let Some(entry) = keys.get(&entry_of(lock, &head)) {
            return Some((head, entry));
        }
        keys.zrem(&queue, &head);
    }
}

fn queue_lives(keys: &mut Keyspace, queue: &str, grant_ms: u64) {
    if keys.pttl(queue) < grant_ms as i64 {
        keys.pexpire(queue, grant_ms);
    }
}

fn join_queue(
    keys: &mut Keyspace,
    lock: &str,
    owner: &str,
    entry: String,
    grant_ms: u64,
    ticket: Option<u64>,
) -> Option<bool> {
    let queue = queue_of(lock);
    let kept = keys.set_existing(&entry_of(lock, owner), entry.clone(), grant_ms);
    let mut ticket = ticket;
    if !kept {
        if keys.zcard(&queue) >= QUEUE_BOUND {
            return None;
        }
        if ticket.is_none() {
            let last = keys.zlast(&queue).map_or(0, |(_, score)| score as u64);
            ticket = Some(last + 1);
        }
        keys.set(&entry_of(lock, owner), entry, Ttl::Px(grant_ms));
    }
    if let Some(ticket) = ticket {
        keys.zadd(&queue, ticket as i64, owner);
    }
    queue_lives(keys, &queue, grant_ms);
    Some(kept)
}

fn leave_queue(keys: &mut Keyspace, lock: &str, owner: &str) -> bool {
    if keys.del(&entry_of(lock, owner)) {
        keys.zrem(&queue_of(lock), owner);
        return true;
    }
    false
}

fn is_queued(keys: &mut Keyspace, lock: &str, owner: &str) -> bool {
    keys.exists(&entry_of(lock, owner))
}

fn anyone_queued(keys: &mut Keyspace, lock: &str) -> bool {
    keys.zcard(&queue_of(lock)) > 0
}

fn pop_head(keys: &mut Keyspace, lock: &str, head: &str) {
    keys.zrem(&queue_of(lock), head);
    keys.del(&entry_of(lock, head));
}

/// The entry a waiter's ask writes: `<grant ms> <owner>[ <label>]` (no handover channel in
/// one process; a label that starts with `>` gets the empty channel field before it).
fn entry_for(grant_ms: u64, owner: &str, label: &str) -> String {
    match label {
        "" => format!("{grant_ms} {owner}"),
        label if label.starts_with('>') => format!("{grant_ms} {owner} > {label}"),
        label => format!("{grant_ms} {owner} {label}"),
    }
}

/// An entry's grant time and holder label (`release.lua`'s `channel_and_label`).
fn entry_fields(entry: &str) -> (u64, String) {
    let mut fields = entry.splitn(3, ' ');
    let grant = fields.next().and_then(|ms| ms.parse().ok()).unwrap_or(0);
    let _owner = fields.next();
    let rest = fields.next().unwrap_or("");
    let label = match rest.strip_prefix('>') {
        // A channel field, empty or not, then the label.
        Some(channel_and_label) => channel_and_label
            .split_once(' ')
            .map_or("", |(_, label)| label),
        None => rest,
    };
    (grant, label.to_owned())
}

/// The next fencing token after `last`: `max(last + 1, the clock in µs)`; 0 without tokens.
fn next_fence(keys: &Keyspace, settings: &Settings, last: u64) -> u64 {
    match settings.fenced {
        true => keys.time_us().max(last + 1),
        false => 0,
    }
}

#[cfg(distlock_test_hooks)]
/// `SET <lock> "L0 <owner>[ <label>]" NX PX <ttl>`: an efficiency lock's first try, which takes
/// the lock only where its key does not exist. `true` when it did.
pub(crate) fn claim(
    keys: &mut Keyspace,
    settings: &Settings,
    lock: &str,
    owner: &str,
    ttl_ms: u64,
) -> bool {
    if keys.get(lock).is_some() {
        return false;
    }
    let value = LockValue::held(State::Held, 0, owner, settings.label.as_bytes());
    keys.set(
        lock,
        String::from_utf8(value).expect("the label is text"),
        Ttl::Px(ttl_ms),
    );
    true
}

fn ms_left(until_us: u64, now_us: u64) -> i64 {
    (until_us as i64 - now_us as i64 + 999).div_euclid(1000)
}

// --- acquire.lua ---

/// `acquire.lua`: one answer per call.
pub(crate) fn acquire(
    keys: &mut Keyspace,
    settings: &Settings,
    calls: &[AcquireCall],
) -> Vec<Acquire> {
    calls
        .iter()
        .map(|call| acquire_one(keys, settings, call))
        .collect()
}

fn acquire_one(keys: &mut Keyspace, settings: &Settings, call: &AcquireCall) -> Acquire {
    let lock = &call.lock;
    let mut last = 0;
    let mut held_as = State::Held;
    if let Some(value) = keys.get(lock) {
        let Some(parsed) = LockValue::parse(&value) else {
            return Acquire::ForeignValue;
        };
        last = parsed.token;
        held_as = match found(keys, settings, call, &parsed) {
            ControlFlow::Break(answer) => return answer,
            ControlFlow::Continue(held_as) => held_as,
        };
    }
    if settings.grant_ms > 0 && queue_exists(keys, lock) {
        held_as = match behind_the_queue(keys, settings, call, held_as) {
            ControlFlow::Break(answer) => return answer,
            ControlFlow::Continue(held_as) => held_as,
        };
    }
    let token = next_fence(keys, settings, last);
    let value = LockValue::held(held_as, token, &call.owner, settings.label.as_bytes());
    let value = String::from_utf8(value).expect("the label is text");
    keys.set(lock, value, Ttl::Px(call.ttl_ms));
    Acquire::Granted { token }
}

/// What the lock's value makes of an acquire: an answer, or the state it grants the lock in
/// (unless the queue says otherwise).
fn found(
    keys: &mut Keyspace,
    settings: &Settings,
    call: &AcquireCall,
    parsed: &LockValue<'_>,
) -> ControlFlow<Acquire, State> {
    match parsed.state {
        State::Free => ControlFlow::Continue(State::Held),
        State::Permits | State::PermitsRefused => ControlFlow::Break(Acquire::OtherKind),
        State::ReadHeld | State::ReadHeldWriterWaits => read_held(keys, call, parsed),
        State::Reserved | State::ReservedTurnedAway | State::ReservedForWriter => {
            reserved(keys, call, parsed)
        }
        State::Held | State::HeldQueued | State::HeldWaitedOn => {
            ControlFlow::Break(held(keys, settings, call, parsed))
        }
    }
}

/// Readers hold it: busy while any is left (a waiting writer records its intent); free, and
/// waited on if a writer waited, when they are all gone.
fn read_held(
    keys: &mut Keyspace,
    call: &AcquireCall,
    parsed: &LockValue<'_>,
) -> ControlFlow<Acquire, State> {
    let (lock, last) = (&call.lock, parsed.token);
    let holders = holders_of(lock);
    let now_ms = (keys.time_us() / 1000) as i64;
    keys.zremrange_upto(&holders, now_ms);
    if keys.zcard(&holders) > 0 {
        if call.asking.asker != Asker::Once {
            let intent = keys.time_us() + WRITER_INTENT.as_micros() as u64;
            keys.set(lock, format!("S{last} {intent}"), Ttl::Keep);
            // The intent outlives readers whose leases run out first (a reader that crashed).
            let intent_ms = WRITER_INTENT.as_millis() as u64;
            if keys.pttl(lock) < intent_ms as i64 {
                keys.pexpire(lock, intent_ms);
            }
        }
        return ControlFlow::Break(Acquire::Busy {
            pttl: millis::decode(keys.pttl(lock)),
        });
    }
    keys.del(&holders);
    ControlFlow::Continue(match parsed.state {
        State::ReadHeldWriterWaits => State::HeldWaitedOn,
        _ => State::Held,
    })
}

/// Free, reserved for the waiters a release notified: theirs (and a waiter's) until it ends.
fn reserved(
    keys: &mut Keyspace,
    call: &AcquireCall,
    parsed: &LockValue<'_>,
) -> ControlFlow<Acquire, State> {
    let left = ms_left(parsed.until_us.unwrap_or(0), keys.time_us());
    let asker = call.asking.asker;
    if left <= 0 {
        return ControlFlow::Continue(State::Held);
    }
    if asker == Asker::Waiting {
        return ControlFlow::Continue(match parsed.state {
            State::Reserved => State::Held,
            _ => State::HeldWaitedOn,
        });
    }
    if parsed.state == State::Reserved && asker == Asker::WillWait {
        keys.set_first(&call.lock, State::ReservedTurnedAway.letter());
    }
    ControlFlow::Break(Acquire::Reserved {
        left: millis::decode(left),
    })
}

/// Held: ours (an idempotent retry), or busy — queued, or marked as waited on.
fn held(
    keys: &mut Keyspace,
    settings: &Settings,
    call: &AcquireCall,
    parsed: &LockValue<'_>,
) -> Acquire {
    let (lock, asker) = (&call.lock, call.asking.asker);
    if parsed.owner == Some(call.owner.as_str()) {
        keys.pexpire(lock, call.ttl_ms);
        return Acquire::Granted {
            token: parsed.token,
        };
    }
    let pttl = millis::decode(keys.pttl(lock));
    let queued = match settings.grant_ms > 0 && asker != Asker::Once {
        true => queue_up(keys, settings, call),
        false => None,
    };
    if let Some(kept) = queued {
        if parsed.state == State::Held {
            keys.set_first(lock, State::HeldQueued.letter());
        }
        return Acquire::Queued { pttl, anew: !kept };
    }
    if parsed.state != State::HeldWaitedOn && asker != Asker::Once {
        keys.set_first(lock, State::HeldWaitedOn.letter());
    }
    Acquire::Busy { pttl }
}

/// Free, and waiters may be queued: the first of them takes it, the others wait behind.
fn behind_the_queue(
    keys: &mut Keyspace,
    settings: &Settings,
    call: &AcquireCall,
    mut held_as: State,
) -> ControlFlow<Acquire, State> {
    let (lock, owner) = (&call.lock, &call.owner);
    match queue_head(keys, lock) {
        Some((head, _)) if head == *owner => {
            if call.asking.ticket.is_none() {
                pop_head(keys, lock, owner);
            }
            if held_as == State::Held && anyone_queued(keys, lock) {
                held_as = State::HeldQueued;
            }
            ControlFlow::Continue(held_as)
        }
        Some((head, _)) => {
            let pttl = millis::decode(keys.pttl(&entry_of(lock, &head)));
            let queued = match call.asking.asker != Asker::Once {
                true => queue_up(keys, settings, call),
                false => None,
            };
            ControlFlow::Break(match queued {
                Some(kept) => Acquire::Queued { pttl, anew: !kept },
                None => Acquire::Busy { pttl },
            })
        }
        None => ControlFlow::Continue(held_as),
    }
}

/// `acquire.lua`'s `queue_up`: the caller queued behind the holder or first waiter; whether
/// its place was kept (`None`: the queue is full).
fn queue_up(keys: &mut Keyspace, settings: &Settings, call: &AcquireCall) -> Option<bool> {
    let mine = is_queued(keys, &call.lock, &call.owner);
    if mutated(settings, Mutation::FirstWaiterOnly) && !mine && anyone_queued(keys, &call.lock) {
        return None;
    }
    let grant_ms = settings.grant_ms.min(call.ttl_ms);
    let entry = entry_for(grant_ms, &call.owner, &settings.label);
    join_queue(
        keys,
        &call.lock,
        &call.owner,
        entry,
        grant_ms,
        call.asking.ticket,
    )
}

// --- release.lua ---

/// `release.lua`: one answer per call; what it published is appended to `published`.
pub(crate) fn release(
    keys: &mut Keyspace,
    settings: &Settings,
    calls: &[ReleaseCall],
    published: &mut Published,
) -> Vec<Release> {
    calls
        .iter()
        .map(|call| release_one(keys, settings, call, published))
        .collect()
}

fn release_one(
    keys: &mut Keyspace,
    settings: &Settings,
    call: &ReleaseCall,
    published: &mut Published,
) -> Release {
    let lock = call.lock.as_str();
    let mut owner = call.owner.clone();
    let (mut successor, mut pledged) = (None, None);
    if let Some((token, ttl, grant, ahead)) = &call.successor {
        match ttl {
            0 => pledged = Some(token.clone()),
            _ => successor = Some((token.clone(), *ttl, *grant, *ahead)),
        }
    }
    let value = keys.get(lock);
    let parsed = value.as_deref().map(LockValue::parse);
    let code = match parsed {
        Some(Some(held)) if held.state.is_exclusive() => {
            let holder = held.owner.unwrap_or_default().to_owned();
            if pledged.as_deref() == Some(holder.as_str()) {
                owner = holder.clone();
            }
            release_held(
                keys, settings, lock, &held, &holder, &owner, &successor, &pledged, published,
            )
        }
        Some(Some(free)) if free.state.is_free() => Release::Expired,
        Some(_) => Release::TakenOver,
        None => Release::Expired,
    };
    let not_ours = matches!(code, Release::Expired | Release::TakenOver);
    if !call.keeps_place && (!settings.hands_over || not_ours) {
        leave_queue(keys, lock, &owner);
        if let Some(pledged) = &pledged {
            leave_queue(keys, lock, pledged);
        }
    }
    code
}

#[allow(clippy::too_many_arguments)]
fn release_held(
    keys: &mut Keyspace,
    settings: &Settings,
    lock: &str,
    held: &LockValue<'_>,
    holder: &str,
    owner: &str,
    successor: &Option<(String, u64, Option<u64>, bool)>,
    pledged: &Option<String>,
    published: &mut Published,
) -> Release {
    if let Some((token, _, _, _)) = successor {
        if holder == token {
            return Release::Transferred { token: held.token };
        }
    }
    if holder != owner && !mutated(settings, Mutation::ReleaseIgnoresOwner) {
        if let Some((token, _, Some(_), _)) = successor {
            if is_queued(keys, lock, token) {
                return Release::HandedOverSuccessorQueued;
            }
        }
        if let Some(pledged) = pledged {
            if leave_queue(keys, lock, pledged) {
                return Release::Released;
            }
        }
        return Release::TakenOver;
    }
    let label = held.label.unwrap_or("");
    if let Some((token, ttl, _, ahead)) = successor {
        if held.state == State::Held || (held.state == State::HeldQueued && *ahead) {
            let fence = next_fence(keys, settings, held.token);
            let value = LockValue::held(held.state, fence, token, label.as_bytes());
            keys.set(lock, String::from_utf8(value).expect("text"), Ttl::Px(*ttl));
            return Release::Transferred { token: fence };
        }
    }
    if held.state == State::Held && !settings.fenced {
        keys.del(lock);
        return Release::Released;
    }
    if held.state == State::Held {
        keys.set(
            lock,
            LockValue::free(held.token),
            Ttl::Px(settings.marker_ttl_ms),
        );
        return Release::Released;
    }
    let heir = match settings.hands_over {
        true => queue_head(keys, lock),
        false => None,
    };
    let Some((heir, entry)) = heir else {
        let until_us = (keys.time_us() / 1000 + settings.window_ms) * 1000;
        // Without tokens, nothing outlives the reservation.
        let marker_ms = match settings.fenced {
            true => settings.marker_ttl_ms,
            false => settings.window_ms.max(1),
        };
        keys.set(
            lock,
            format!("P{} {until_us}", held.token),
            Ttl::Px(marker_ms),
        );
        published.push((channel_of(lock), lock.to_owned()));
        return Release::Released;
    };
    pop_head(keys, lock, &heir);
    let fence = next_fence(keys, settings, held.token);
    let mut code = Release::HandedOver;
    if let Some((token, _, Some(grant), _)) = successor {
        let entry = entry_for(*grant, token, label);
        if join_queue(keys, lock, token, entry, *grant, None).is_some() {
            code = Release::HandedOverSuccessorQueued;
        }
    }
    let held_as = match held.state {
        State::HeldQueued if anyone_queued(keys, lock) => State::HeldQueued,
        State::HeldQueued => State::Held,
        _ => State::HeldWaitedOn,
    };
    let (grant_ms, heir_label) = entry_fields(&entry);
    let value = LockValue::held(held_as, fence, &heir, heir_label.as_bytes());
    keys.set(
        lock,
        String::from_utf8(value).expect("text"),
        Ttl::Px(grant_ms),
    );
    published.push((channel_of(lock), format!("G{fence} {heir}")));
    code
}

// --- renew.lua ---

/// One lease of a renewal: its lock, its owner (a shared holder's member, `<owner> <label>`,
/// with `shared`), and its new TTL.
#[derive(Debug, Clone)]
pub(crate) struct RenewCall {
    pub(crate) lock: String,
    pub(crate) owner: String,
    pub(crate) shared: bool,
    pub(crate) ttl_ms: u64,
}

/// `renew.lua`: one answer per lease.
pub(crate) fn renew(keys: &mut Keyspace, calls: &[RenewCall]) -> Vec<Renew> {
    calls.iter().map(|call| renew_one(keys, call)).collect()
}

fn renew_one(keys: &mut Keyspace, call: &RenewCall) -> Renew {
    let value = keys.get(&call.lock);
    let parsed = value.as_deref().and_then(LockValue::parse);
    let state = parsed.as_ref().map(|value| value.state);
    if call.shared {
        let holders = holders_of(&call.lock);
        let now_ms = (keys.time_us() / 1000) as i64;
        if state.is_some_and(State::is_exclusive) {
            return Renew::TakenOver;
        }
        let alive = keys
            .zscore(&holders, &call.owner)
            .is_some_and(|expiry| expiry > now_ms);
        if alive && state.is_some_and(State::is_shared) {
            keys.zadd(&holders, now_ms + call.ttl_ms as i64, &call.owner);
            if keys.pttl(&call.lock) < call.ttl_ms as i64 {
                keys.pexpire(&call.lock, call.ttl_ms);
                keys.pexpire(&holders, call.ttl_ms);
            }
            return Renew::Renewed;
        }
        return Renew::Gone;
    }
    match parsed {
        Some(held) if held.state.is_exclusive() => {
            if held.owner == Some(call.owner.as_str()) {
                keys.pexpire(&call.lock, call.ttl_ms);
                Renew::Renewed
            } else {
                Renew::TakenOver
            }
        }
        _ => Renew::Gone,
    }
}

// --- shared_acquire.lua ---

/// A shared holder's kind: a reader, or a permit of a semaphore of `n`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sharing {
    Reader,
    Permit(u32),
}

/// `shared_acquire.lua` for `member` (`<owner> <label>`).
pub(crate) fn shared_acquire(
    keys: &mut Keyspace,
    lock: &str,
    sharing: Sharing,
    member: &str,
    ttl_ms: u64,
    asker: Asker,
) -> SharedAcquire {
    let value = keys.get(lock);
    let parsed = match value.as_deref() {
        Some(value) => match LockValue::parse(value) {
            Some(parsed) => Some(parsed),
            None => return SharedAcquire::ForeignValue,
        },
        None => None,
    };
    let ask = SharedAsk {
        lock,
        holders: holders_of(lock),
        sharing,
        asker,
        now_us: keys.time_us(),
        state: parsed.as_ref().map(|value| value.state),
        until_us: parsed.as_ref().and_then(|value| value.until_us),
        last: parsed.as_ref().map_or(0, |value| value.token),
    };
    if let Some(refused) = shared_refused(keys, &ask) {
        return refused;
    }
    let now_ms = (ask.now_us / 1000) as i64;
    let shared = ask.shared();
    if shared {
        keys.zremrange_upto(&ask.holders, now_ms);
    }
    let mine = shared && keys.zscore(&ask.holders, member).is_some();
    let fence = match mine {
        true => ask.last,
        false => match shared_token(keys, &ask) {
            Ok(fence) => fence,
            Err(busy) => return busy,
        },
    };
    keys.zadd(&ask.holders, now_ms + ttl_ms as i64, member);
    let longest = keys.zlast(&ask.holders).map_or(now_ms, |(_, score)| score);
    let live_ms = (longest - now_ms).max(1) as u64;
    let next_value = match sharing {
        Sharing::Reader => match (ask.state, ask.until_us) {
            (Some(State::ReadHeldWriterWaits), Some(until)) if until > ask.now_us => {
                value.clone().expect("read-held")
            }
            _ => format!("R{fence}"),
        },
        Sharing::Permit(_) => match ask.state {
            Some(State::PermitsRefused) => format!("N{fence}"),
            _ => format!("M{fence}"),
        },
    };
    keys.set(lock, next_value, Ttl::Px(live_ms));
    keys.pexpire(&ask.holders, live_ms);
    SharedAcquire::Granted { token: fence }
}

/// A reader's or a permit's acquire, with what the lock's value says.
struct SharedAsk<'a> {
    lock: &'a str,
    holders: String,
    sharing: Sharing,
    asker: Asker,
    now_us: u64,
    state: Option<State>,
    until_us: Option<u64>,
    /// The last token issued (0: none known).
    last: u64,
}

impl SharedAsk<'_> {
    fn permit(&self) -> bool {
        matches!(self.sharing, Sharing::Permit(_))
    }

    fn reading(&self) -> bool {
        matches!(
            self.state,
            Some(State::ReadHeld | State::ReadHeldWriterWaits)
        )
    }

    fn counting(&self) -> bool {
        matches!(self.state, Some(State::Permits | State::PermitsRefused))
    }

    /// Held by readers or permits (of either kind).
    fn shared(&self) -> bool {
        self.reading() || self.counting()
    }
}

/// The refusals that need no look at the holders: a writer holds it, another kind holds it,
/// or it is reserved for the waiters a release notified (or a waiting writer).
fn shared_refused(keys: &mut Keyspace, ask: &SharedAsk<'_>) -> Option<SharedAcquire> {
    let (lock, state, asker) = (ask.lock, ask.state, ask.asker);
    if state.is_some_and(State::is_exclusive) {
        if ask.permit() {
            return Some(SharedAcquire::OtherKind);
        }
        if state != Some(State::HeldWaitedOn) && asker != Asker::Once {
            keys.set_first(lock, State::HeldWaitedOn.letter());
        }
        return Some(SharedAcquire::Busy {
            ms: millis::decode(keys.pttl(lock)),
        });
    }
    if (ask.reading() && ask.permit()) || (ask.counting() && !ask.permit()) {
        return Some(SharedAcquire::OtherKind);
    }
    let (Some(reserved), Some(until)) = (state, ask.until_us) else {
        return None;
    };
    let free_marker = matches!(
        reserved,
        State::Reserved | State::ReservedTurnedAway | State::ReservedForWriter
    );
    let left = ms_left(until, ask.now_us);
    if free_marker && left > 0 && (asker != Asker::Waiting || reserved == State::ReservedForWriter)
    {
        if reserved == State::Reserved && asker == Asker::WillWait {
            keys.set_first(lock, State::ReservedTurnedAway.letter());
        }
        return Some(SharedAcquire::Reserved {
            ms: millis::decode(left),
        });
    }
    None
}

/// A new holder's token, or why it must wait: a writer's intent, or every permit taken.
fn shared_token(keys: &mut Keyspace, ask: &SharedAsk<'_>) -> Result<u64, SharedAcquire> {
    let now_us = ask.now_us;
    if ask.state == Some(State::ReadHeldWriterWaits) {
        let until = ask.until_us.unwrap_or(0);
        if until > now_us {
            return Err(SharedAcquire::Busy {
                ms: millis::decode(ms_left(until, now_us)),
            });
        }
    }
    match ask.sharing {
        Sharing::Permit(permits) => {
            if ask.shared() && keys.zcard(&ask.holders) >= permits as usize {
                if ask.state == Some(State::Permits) && ask.asker != Asker::Once {
                    keys.set_first(ask.lock, State::PermitsRefused.letter());
                }
                let now_ms = (now_us / 1000) as i64;
                let first = keys.zfirst(&ask.holders).map_or(0, |(_, score)| score);
                return Err(SharedAcquire::Busy {
                    ms: millis::decode((first - now_ms).max(1)),
                });
            }
            Ok((ask.last + 1).max(now_us))
        }
        Sharing::Reader if ask.last == 0 => Ok(now_us),
        Sharing::Reader => Ok(ask.last),
    }
}

// --- shared_release.lua ---

/// `shared_release.lua` for `member`.
pub(crate) fn shared_release(
    keys: &mut Keyspace,
    settings: &Settings,
    lock: &str,
    member: &str,
    published: &mut Published,
) -> SharedRelease {
    let holders = holders_of(lock);
    let now_us = keys.time_us();
    let now_ms = (now_us / 1000) as i64;
    let expiry = keys.zscore(&holders, member);
    keys.zremrange_upto(&holders, now_ms);
    if expiry.is_none_or(|expiry| expiry <= now_ms) {
        return SharedRelease::Expired;
    }
    keys.zrem(&holders, member);
    let value = keys.get(lock);
    let Some(parsed) = value.as_deref().and_then(LockValue::parse) else {
        return SharedRelease::Expired;
    };
    if !parsed.state.is_shared() {
        return SharedRelease::Expired;
    }
    let fence = parsed.token;
    let waited = matches!(
        parsed.state,
        State::ReadHeldWriterWaits | State::PermitsRefused
    );
    if keys.zcard(&holders) == 0 {
        if waited {
            let mut until_us = now_us + settings.window_ms * 1000;
            let mut marker = 'P';
            if parsed.state == State::ReadHeldWriterWaits {
                marker = 'V';
                until_us = until_us.max(parsed.until_us.unwrap_or(0));
            }
            keys.set(
                lock,
                format!("{marker}{fence} {until_us}"),
                Ttl::Px(settings.marker_ttl_ms),
            );
        } else {
            keys.set(
                lock,
                LockValue::free(fence),
                Ttl::Px(settings.marker_ttl_ms),
            );
        }
        keys.del(&holders);
    } else if parsed.state == State::PermitsRefused {
        keys.set_first(lock, State::Permits.letter());
    } else {
        return SharedRelease::Released;
    }
    if waited {
        published.push((channel_of(lock), lock.to_owned()));
    }
    SharedRelease::Released
}

// --- inspect.lua and unlock.lua ---

/// Who holds a lock, as `inspect.lua` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holding {
    /// The owner token ("" for readers and permits).
    pub(crate) owner: String,
    pub(crate) token: u64,
    pub(crate) pttl_ms: i64,
    /// The holder label ("" when none was written; a shared key: one holder's).
    pub(crate) label: String,
    pub(crate) waited_on: bool,
    /// Readers or permit holders: how many hold it.
    pub(crate) shared: Option<u64>,
}

/// `inspect.lua`: who holds `lock`; `None` when it is free. `Err` for a value distlock did not
/// write.
pub(crate) fn inspect(keys: &mut Keyspace, lock: &str) -> Result<Option<Holding>, String> {
    let Some(value) = keys.get(lock) else {
        return Ok(None);
    };
    let Some(parsed) = LockValue::parse(&value) else {
        return Err(format!("{lock} holds a value distlock did not write"));
    };
    if parsed.state.is_free() {
        return Ok(None);
    }
    if parsed.state.is_shared() {
        let holders = holders_of(lock);
        let now_ms = (keys.time_us() / 1000) as i64;
        let count = keys.zcount_above(&holders, now_ms);
        if count == 0 {
            return Ok(None);
        }
        let longest = keys.zlast(&holders).map_or(now_ms, |(_, score)| score);
        let first = keys.zfirst_above(&holders, now_ms).unwrap_or_default();
        let label = first.split_once(' ').map_or("", |(_, label)| label);
        return Ok(Some(Holding {
            owner: String::new(),
            token: parsed.token,
            pttl_ms: longest - now_ms,
            label: label.to_owned(),
            waited_on: parsed.state.is_waited_on(),
            shared: Some(count as u64),
        }));
    }
    Ok(Some(Holding {
        owner: parsed.owner.unwrap_or_default().to_owned(),
        token: parsed.token,
        pttl_ms: keys.pttl(lock),
        label: parsed.label.unwrap_or("").to_owned(),
        waited_on: parsed.state.is_waited_on(),
        shared: None,
    }))
}

/// `unlock.lua`: removes whoever holds `lock`, leaving a marker one above its token and waking
/// its waiters; the holder removed (`None`: it was free).
pub(crate) fn unlock(
    keys: &mut Keyspace,
    settings: &Settings,
    lock: &str,
    published: &mut Published,
) -> Result<Option<Holding>, String> {
    let Some(holding) = inspect_for_unlock(keys, lock)? else {
        return Ok(None);
    };
    if holding.shared.is_some() {
        keys.del(&holders_of(lock));
    }
    keys.set(
        lock,
        LockValue::free(holding.token + 1),
        Ttl::Px(settings.marker_ttl_ms),
    );
    published.push((channel_of(lock), lock.to_owned()));
    Ok(Some(holding))
}

/// What `unlock.lua` reports of the holder it removes: as `inspect.lua`, but a shared key's
/// holders are counted whether or not their leases live (`ZCARD`), with the key's own TTL.
fn inspect_for_unlock(keys: &mut Keyspace, lock: &str) -> Result<Option<Holding>, String> {
    let Some(value) = keys.get(lock) else {
        return Ok(None);
    };
    let Some(parsed) = LockValue::parse(&value) else {
        return Err(format!("{lock} holds a value distlock did not write"));
    };
    if parsed.state.is_free() {
        return Ok(None);
    }
    if parsed.state.is_shared() {
        return Ok(Some(Holding {
            owner: String::new(),
            token: parsed.token,
            pttl_ms: keys.pttl(lock),
            label: String::new(),
            waited_on: parsed.state.is_waited_on(),
            shared: Some(keys.zcard(&holders_of(lock)) as u64),
        }));
    }
    Ok(Some(Holding {
        owner: parsed.owner.unwrap_or_default().to_owned(),
        token: parsed.token,
        pttl_ms: keys.pttl(lock),
        label: parsed.label.unwrap_or("").to_owned(),
        waited_on: parsed.state.is_waited_on(),
        shared: None,
    }))
}
