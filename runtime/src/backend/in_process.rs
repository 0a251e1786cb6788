//! The in-process backend (`memory://`): the same semantics as one Redis — TTL expiry, ownership,
//! fencing tokens, idempotent acquire — inside this process, for demos and users' unit tests.
//!
//! It is never a silent fallback: it is used only where `memory://` or [`Backend::in_process`]
//! asks for it.
//!
//! [`Backend::in_process`]: crate::Backend::in_process

use super::{Acquired, Holder, Ownership, Renewal, Store, StoreResult};
use crate::owner::Owner;
use crate::wait::{Channels, ReleaseWatch};
use futures_util::future::{self, BoxFuture};
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub(crate) struct InProcessStore {
    state: Mutex<State>,
    fence_counter_ttl: Duration,
    /// Release notifications for local waiters, by key.
    channels: Arc<Channels>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Entry>,
    /// Fencing counters, each forgotten `fence_counter_ttl` after its last use: memory stays
    /// bounded by the keys used recently, as with the Redis counter's TTL.
    counters: HashMap<String, (u64, Instant)>,
    operations_since_sweep: usize,
}

struct Entry {
    owner: Owner,
    fence: u64,
    expires_at: Instant,
}

/// Expired entries are removed every this many operations.
const SWEEP_EVERY: usize = 1024;

impl InProcessStore {
    pub(crate) fn new(fence_counter_ttl: Duration) -> Self {
        InProcessStore {
            state: Mutex::new(State::default()),
            fence_counter_ttl,
            channels: Arc::default(),
        }
    }

    fn with_state<T>(&self, f: impl FnOnce(&mut State, Instant) -> T) -> T {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        state.operations_since_sweep += 1;
        if state.operations_since_sweep >= SWEEP_EVERY {
            state.operations_since_sweep = 0;
            state.locks.retain(|_, entry| entry.expires_at > now);
            state
                .counters
                .retain(|_, (_, expires_at)| *expires_at > now);
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

    fn acquire_now(&self, key: &str, owner: &Owner, ttl: Duration) -> Acquired {
        self.with_state(|state, now| {
            if let Some(entry) = Self::live(state, key, now) {
                if entry.owner == *owner {
                    entry.expires_at = now + ttl;
                    return Acquired::Yes { fence: entry.fence };
                }
                return Acquired::Busy {
                    ttl: Some(entry.expires_at - now),
                };
            }
            let last = match state.counters.get(key) {
                Some((last, expires_at)) if *expires_at > now => *last,
                _ => 0,
            };
            let fence = (last + 1).max(unix_micros());
            state
                .counters
                .insert(key.to_owned(), (fence, now + self.fence_counter_ttl));
            state.locks.insert(
                key.to_owned(),
                Entry {
                    owner: owner.clone(),
                    fence,
                    expires_at: now + ttl,
                },
            );
            Acquired::Yes { fence }
        })
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

impl Store for InProcessStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquired>> {
        Box::pin(future::ready(Ok(self.acquire_now(key, owner, ttl))))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
    ) -> BoxFuture<'a, StoreResult<Ownership>> {
        let outcome = self.with_state(|state, now| {
            let outcome = Self::ownership(state, key, owner, now);
            if outcome == Ownership::Ours {
                state.locks.remove(key);
            }
            outcome
        });
        if outcome == Ownership::Ours {
            self.channels.notify(key);
        }
        Box::pin(future::ready(Ok(outcome)))
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> BoxFuture<'a, StoreResult<Vec<Ownership>>> {
        let answers = self.with_state(|state, now| {
            batch
                .iter()
                .map(|item| {
                    let outcome = Self::ownership(state, item.key, item.owner, now);
                    if outcome == Ownership::Ours {
                        if let Some(entry) = state.locks.get_mut(item.key) {
                            entry.expires_at = now + item.ttl;
                        }
                    }
                    outcome
                })
                .collect()
        });
        Box::pin(future::ready(Ok(answers)))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<Option<Holder>>> {
        let holder = self.with_state(|state, now| {
            Self::live(state, key, now).map(|entry| Holder {
                owner: entry.owner.as_str().to_owned(),
                fencing_token: entry.fence,
                ttl: entry.expires_at - now,
            })
        });
        Box::pin(future::ready(Ok(holder)))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, ReleaseWatch> {
        // Releases notify under no lock of the waiter's, and registration is immediate: in force
        // as soon as it returns.
        let watch = self.channels.register(key, None);
        self.channels.confirm(key);
        Box::pin(future::ready(watch))
    }

    fn watched_channels(&self) -> usize {
        self.channels.watched()
    }

    fn doctor(&self) -> BoxFuture<'_, StoreResult<Vec<crate::Finding>>> {
        // Nothing to configure: the map lives and dies with the process, as documented.
        Box::pin(future::ready(Ok(Vec::new())))
    }
}
