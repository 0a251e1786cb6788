//! The in-process backend (`memory://`): the same semantics as one Redis — TTL expiry, ownership,
//! fencing tokens, idempotent acquire — inside this process, for demos and users' unit tests.
//!
//! It is never a silent fallback: it is used only where `memory://` or [`Backend::in_process`]
//! asks for it.
//!
//! [`Backend::in_process`]: crate::Backend::in_process

use super::in_process_shared::{Entered, Shared, SharedLocks};
use crate::engine::{
    Acquired, Asker, Engine, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal,
};
use crate::glob::glob_match;
use crate::key_events::KeyEventSender;
use crate::kind::LockKind;
use crate::owner::Owner;
use crate::wait::{Channels, ReleaseWatch};
use futures_util::future::{self, BoxFuture};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) struct InProcessEngine {
    state: Mutex<State>,
    fence_counter_ttl: Duration,
    /// Release notifications for local waiters, by key.
    channels: Arc<Channels>,
    /// The holder label of every lock (`None`: none).
    label: Option<String>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Entry>,
    /// Read locks and semaphores: each holder with its own lease.
    shared: SharedLocks,
    /// Fencing counters, each forgotten `fence_counter_ttl` after its last use: memory stays
    /// bounded by the keys used recently, as with the Redis counter's TTL.
    counters: HashMap<String, (u64, Instant)>,
    /// One entry per live counter, roughly in expiry order: the oldest are forgotten in
    /// amortised O(1) per operation, never by walking all counters. An entry whose counter was
    /// written again since goes back to the end with the new expiry.
    counter_expiries: VecDeque<(Instant, String)>,
    /// Keys whose counter Redis would still show in the key (a released lock's marker, a shared
    /// key's state), not only in its clock: a reader's token is then the last one issued.
    released: HashSet<String>,
    operations_since_sweep: usize,
}

struct Entry {
    owner: Owner,
    fence: u64,
    expires_at: Instant,
}

/// Expired, never-released locks are removed every this many operations.
const SWEEP_EVERY: usize = 1024;

impl InProcessEngine {
    pub(crate) fn new(fence_counter_ttl: Duration, label: &str) -> Self {
        InProcessEngine {
            state: Mutex::new(State::default()),
            fence_counter_ttl,
            channels: Arc::new(Channels::in_process()),
            label: Some(label.to_owned()).filter(|label| !label.is_empty()),
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        state.operations_since_sweep += 1;
        if state.operations_since_sweep >= SWEEP_EVERY {
            state.operations_since_sweep = 0;
            state.locks.retain(|_, entry| entry.expires_at > now);
            state.shared.retain(|_, shared| shared.is_live(now));
        }
        while let Some((expires_at, _)) = state.counter_expiries.front() {
            if *expires_at > now {
                break;
            }
            let (_, key) = state.counter_expiries.pop_front().expect("front exists");
            match state.counters.get(&key) {
                Some((_, until)) if *until > now => {
                    let until = *until;
                    state.counter_expiries.push_back((until, key));
                }
                _ => {
                    state.counters.remove(&key);
                    state.released.remove(&key);
                }
            }
        }
        f(&mut state, now)
    }

    fn live<'s>(state: &'s mut State, key: &str, now: Instant) -> Option<&'s mut Entry> {
        if state
            .locks
            .get(key)
            .is_some_and(|entry| entry.expires_at <= now)
        {
            state.locks.remove(key);
        }
        state.locks.get_mut(key)
    }

    fn acquire_now(
        &self,
        key: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        self.with_state(|state, now| {
            if let Some(entry) = Self::live(state, key, now) {
                if let LockKind::Permits(_) = kind {
                    return Err(EngineFailure::kind_mismatch(key, kind));
                }
                if kind == LockKind::Exclusive && entry.owner == *owner {
                    entry.expires_at = now + ttl;
                    return Ok(Acquired::Yes { fence: entry.fence });
                }
                return Ok(Acquired::Busy {
                    reserved: false,
                    next: None,
                    ttl: Some(entry.expires_at - now),
                });
            }
            if kind.is_shared() {
                let shared = state
                    .shared
                    .entry(key.to_owned())
                    .or_insert_with(|| Shared::new(kind));
                let entered = shared.enter(key, kind, owner.as_str(), ttl, now)?;
                // The last token, if the last exclusive holder released it (a marker on Redis);
                // after an expiry Redis has no marker and answers its clock.
                let last = match state.released.contains(key) {
                    true => Self::last_token(state, key, now),
                    false => 0,
                };
                let fence = match (entered, kind) {
                    (Entered::Busy(busy), _) => return Ok(busy),
                    // A reader's token is the last one issued: a later writer's is larger.
                    (_, LockKind::Read) if last > 0 => return Ok(Acquired::Yes { fence: last }),
                    (Entered::Again, _) if last > 0 => return Ok(Acquired::Yes { fence: last }),
                    (_, LockKind::Read) => unix_micros(),
                    _ => (last + 1).max(unix_micros()),
                };
                self.record_token(state, key, fence, now);
                state.released.insert(key.to_owned());
                return Ok(Acquired::Yes { fence });
            }
            if let Some(shared) = state.shared.get_mut(key) {
                let live = shared.prune(now);
                if live && shared.is_semaphore() {
                    return Err(EngineFailure::kind_mismatch(key, kind));
                }
                if live {
                    // A single try is not a waiter: it leaves no intent (acquire.lua alike).
                    return Ok(match asker {
                        Asker::Once => Acquired::Busy {
                            ttl: None,
                            reserved: false,
                            next: None,
                        },
                        _ => shared.writer_waits(now),
                    });
                }
                state.shared.remove(key);
            }
            let last = Self::last_token(state, key, now);
            let fence = (last + 1).max(unix_micros());
            self.record_token(state, key, fence, now);
            state.released.remove(key);
            state.locks.insert(
                key.to_owned(),
                Entry {
                    owner: owner.clone(),
                    fence,
                    expires_at: now + ttl,
                },
            );
            Ok(Acquired::Yes { fence })
        })
    }

    /// The last token issued on `key`, while its counter lives (0: none).
    fn last_token(state: &State, key: &str, now: Instant) -> u64 {
        match state.counters.get(key) {
            Some((last, expires_at)) if *expires_at > now => *last,
            _ => 0,
        }
    }

    fn record_token(&self, state: &mut State, key: &str, fence: u64, now: Instant) {
        let expires_at = now + self.fence_counter_ttl;
        if state
            .counters
            .insert(key.to_owned(), (fence, expires_at))
            .is_none()
        {
            state
                .counter_expiries
                .push_back((expires_at, key.to_owned()));
        }
    }

    fn ownership(state: &mut State, key: &str, owner: &Owner, now: Instant) -> Ownership {
        match Self::live(state, key, now) {
            Some(entry) if entry.owner == *owner => Ownership::Ours,
            Some(_) => Ownership::Foreign,
            None => Ownership::Gone,
        }
    }
}

fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

impl Engine for InProcessEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        // Only whether a writer tries once matters here (it leaves no intent for readers): one
        // process's local queue orders every caller, with no other process's waiters to let
        // first and no release to announce beyond the queue.
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(future::ready(
            self.acquire_now(key, owner, ttl, asker, kind),
        ))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        _granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>> {
        let outcome = self.with_state(|state, now| {
            if kind.is_shared() {
                let Some(shared) = state.shared.get_mut(key) else {
                    return Ownership::Gone;
                };
                let outcome = shared.leave(owner.as_str(), now);
                if !shared.is_live(now) {
                    state.shared.remove(key);
                }
                return outcome;
            }
            let outcome = Self::ownership(state, key, owner, now);
            if outcome == Ownership::Ours {
                state.locks.remove(key);
                state.released.insert(key.to_owned());
            }
            outcome
        });
        if outcome == Ownership::Ours {
            self.channels.notify(key);
        }
        Box::pin(future::ready(Ok(outcome)))
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        let answers = self.with_state(|state, now| {
            batch
                .iter()
                .map(|item| {
                    if item.kind.is_shared() {
                        return Some(
                            state
                                .shared
                                .get_mut(item.key)
                                .map_or(Ownership::Gone, |shared| {
                                    shared.renew(item.owner.as_str(), item.ttl, now)
                                }),
                        );
                    }
                    let outcome = Self::ownership(state, item.key, item.owner, now);
                    if outcome == Ownership::Ours {
                        if let Some(entry) = state.locks.get_mut(item.key) {
                            entry.expires_at = now + item.ttl;
                        }
                    }
                    Some(outcome)
                })
                .collect()
        });
        Box::pin(future::ready(Ok(answers)))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        // Every waiter is in this process: it is waited on while a task waits.
        let waited_on = self.channels.is_watched(key);
        let holder = self.with_state(|state, now| {
            if let Some(shared) = state.shared.get_mut(key) {
                if shared.prune(now) {
                    let fence = Self::last_token(state, key, now);
                    let shared = &state.shared[key];
                    return Some(shared.holder(fence, self.label.clone(), now));
                }
            }
            Self::live(state, key, now).map(|entry| Holder {
                owner: entry.owner.as_str().to_owned(),
                fencing_token: entry.fence,
                ttl: entry.expires_at - now,
                label: self.label.clone(),
                waited_on,
                waiting: Some(u64::from(waited_on)),
                shared: None,
            })
        });
        Box::pin(future::ready(Ok(holder)))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        // Releases notify under no lock of the waiter's, and registration is immediate: in force
        // as soon as it returns, on the one in-process link (epoch 0).
        let watch = self.channels.register(key, None);
        self.channels.confirm(key, 0);
        Box::pin(future::ready(Ok(watch)))
    }

    fn watched_channels(&self) -> usize {
        self.channels.watched()
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<crate::Finding>>> {
        // Nothing to configure: the map lives and dies with the process, as documented.
        Box::pin(future::ready(Ok(Vec::new())))
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        let keys = self.with_state(|state, now| {
            let mut keys: Vec<String> = state
                .locks
                .iter()
                .filter(|(key, entry)| entry.expires_at > now && glob_match(pattern, key))
                .map(|(key, _)| key.clone())
                .collect();
            keys.extend(
                state
                    .shared
                    .iter_mut()
                    .filter_map(|(key, shared)| {
                        (glob_match(pattern, key) && shared.prune(now)).then_some(key)
                    })
                    .cloned(),
            );
            keys.sort_unstable();
            keys
        });
        Box::pin(future::ready(Ok(keys)))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        let removed = self.with_state(|state, now| {
            if let Some(mut shared) = state.shared.remove(key) {
                if shared.prune(now) {
                    let fence = Self::last_token(state, key, now);
                    // Every later token is larger than the removed holders' (unlock.lua alike).
                    self.record_token(state, key, fence + 1, now);
                    state.released.insert(key.to_owned());
                    return Some(shared.holder(fence, self.label.clone(), now));
                }
            }
            let entry = Self::live(state, key, now)?;
            let holder = Holder {
                owner: entry.owner.as_str().to_owned(),
                fencing_token: entry.fence,
                ttl: entry.expires_at - now,
                label: self.label.clone(),
                waited_on: false,
                waiting: None,
                shared: None,
            };
            state.locks.remove(key);
            // The counter already exceeds the removed token: the next one is larger.
            Some(holder)
        });
        if removed.is_some() {
            self.channels.notify(key);
        }
        Box::pin(future::ready(Ok(removed)))
    }

    fn follow<'a>(
        &'a self,
        _key: &'a str,
        _enable: bool,
        _events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(future::ready(Err(EngineFailure {
            ambiguous: false,
            source: "the in-process backend (memory://) has no key events to follow; follow a \
                     lock on a Redis backend"
                .into(),
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fence_counters_are_forgotten_without_walking_them_all() {
        let store = InProcessEngine::new(Duration::from_millis(1), "");
        for i in 0..1_000 {
            let owner = Owner::random();
            let key = format!("k{i}");
            assert!(matches!(
                store.acquire_now(
                    &key,
                    &owner,
                    Duration::from_secs(1),
                    Asker::Once,
                    LockKind::Exclusive
                ),
                Ok(Acquired::Yes { .. })
            ));
            store.with_state(|state, _| state.locks.remove(&key));
        }
        // No event marks a TTL running out; waiting it out is the point.
        std::thread::sleep(Duration::from_millis(5));
        let (counters, queued) =
            store.with_state(|state, _| (state.counters.len(), state.counter_expiries.len()));
        assert_eq!((counters, queued), (0, 0));

        // A key used over and over keeps one counter and one queue entry.
        let owner = Owner::random();
        for _ in 0..100 {
            let _ = store.acquire_now(
                "hot",
                &owner,
                Duration::from_secs(1),
                Asker::Once,
                LockKind::Exclusive,
            );
            store.with_state(|state, _| state.locks.remove("hot"));
        }
        let (counters, queued) =
            store.with_state(|state, _| (state.counters.len(), state.counter_expiries.len()));
        assert!(
            counters <= 1 && queued <= 1,
            "{counters} counters, {queued} queued"
        );
    }
}
