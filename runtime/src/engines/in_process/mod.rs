//! The in-process backend (`memory://`): the lock scripts' transitions (`scripts.rs`, the Rust
//! twin of `engines/redis/scripts/*.lua`) run on a keyspace in this process's memory
//! (`keyspace.rs`), for demos and users' unit tests. Same values, same replies, same fencing tokens as one Redis;
//! `tests/protocol.rs` checks them against a real server step by step.
//!
//! It is never a silent fallback: it is used only where `memory://` or [`Backend::in_process`]
//! asks for it.
//!
//! Every waiter is a task of this process, queued by the key's local turn: the engine queues
//! nobody (grant time 0) and reserves nothing for notified waiters (a window of 0).
//!
//! [`Backend::in_process`]: crate::Backend::in_process

mod constructors;
mod keyspace;
pub(crate) mod scripts;
mod spec;
#[cfg(distlock_test_hooks)]
pub(crate) mod twin;

pub(crate) use keyspace::Keyspace;
pub(crate) use spec::REGISTRATION;

use crate::engines::engine::{
    Acquired, Asker, Engine, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal,
};
use crate::engines::redis::protocol::{millis, Acquire, Release, SharedRelease};
use crate::lock::key::{channel_of, lock_name};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::util::glob::glob_match;
use crate::wait::{Channels, ReleaseWatch};
use futures_util::future::{self, BoxFuture};
use scripts::{AcquireCall, Asking, Holding, Published, ReleaseCall, RenewCall, Settings, Sharing};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub(crate) struct InProcessEngine {
    keys: Mutex<Keyspace>,
    settings: Settings,
    prefix: String,
    /// Release notifications for local waiters, by channel.
    channels: Arc<Channels>,
}

impl InProcessEngine {
    /// `fenced`: exclusive locks carry fencing tokens (`false`: efficiency locks, token 0).
    pub(crate) fn new(prefix: &str, marker_ttl: Duration, label: &str, fenced: bool) -> Self {
        InProcessEngine {
            keys: Mutex::new(Keyspace::default()),
            settings: Settings {
                label: label.to_owned(),
                grant_ms: 0,
                marker_ttl_ms: millis::arg(marker_ttl),
                window_ms: 0,
                hands_over: true,
                fenced,
                #[cfg(distlock_test_hooks)]
                mutation: None,
            },
            prefix: prefix.to_owned(),
            channels: Arc::new(Channels::in_process()),
        }
    }

    /// Runs `script` on the keyspace, then delivers what it published (outside the keyspace's
    /// lock: a woken waiter may ask at once).
    fn run<T>(&self, script: impl FnOnce(&mut Keyspace, &Settings, &mut Published) -> T) -> T {
        let mut published = Published::new();
        let answer = {
            let mut keys = self.keys.lock().unwrap_or_else(|e| e.into_inner());
            script(&mut keys, &self.settings, &mut published)
        };
        for (channel, message) in published {
            self.channels.deliver(&channel, message.as_bytes());
        }
        answer
    }

    fn lock(&self, key: &str) -> String {
        lock_name(&self.prefix, key)
    }

    /// A shared holder's member among the key's holders: `<owner> <label>`.
    fn member(&self, owner: &Owner) -> String {
        format!("{} {}", owner.as_str(), self.settings.label)
    }

    fn acquire_now(
        &self,
        key: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        let lock = self.lock(key);
        let ttl_ms = millis::arg(ttl);
        if kind.is_shared() {
            let sharing = match kind {
                LockKind::Permits(n) => Sharing::Permit(n),
                _ => Sharing::Reader,
            };
            let member = self.member(owner);
            let answer = self.run(|keys, _, _| {
                scripts::shared_acquire(keys, &lock, sharing, &member, ttl_ms, asker)
            });
            return Acquire::from(answer).acquired(None, key, kind, || foreign(key));
        }
        let call = AcquireCall {
            lock,
            owner: owner.as_str().to_owned(),
            ttl_ms,
            asking: Asking {
                asker,
                ticket: None,
            },
        };
        let answer = self
            .run(|keys, settings, _| scripts::acquire(keys, settings, std::slice::from_ref(&call)));
        // Nobody queues here (grant time 0): a queued answer cannot come, and would read busy.
        match answer.first().copied() {
            Some(answer) => answer.acquired(None, key, kind, || foreign(key)),
            None => Err(foreign(key)),
        }
    }

    fn release_now(&self, key: &str, owner: &Owner, kind: LockKind) -> Ownership {
        let lock = self.lock(key);
        if kind.is_shared() {
            let member = self.member(owner);
            let answer = self.run(|keys, settings, published| {
                scripts::shared_release(keys, settings, &lock, &member, published)
            });
            return match answer {
                SharedRelease::Released | SharedRelease::ReleasedUnannounced => Ownership::Ours,
                SharedRelease::Expired => Ownership::Gone,
            };
        }
        let call = ReleaseCall {
            lock,
            owner: owner.as_str().to_owned(),
            ..ReleaseCall::default()
        };
        let answer = self.run(|keys, settings, published| {
            scripts::release(keys, settings, std::slice::from_ref(&call), published)
        });
        match answer.first() {
            Some(Release::Expired) | None => Ownership::Gone,
            Some(Release::TakenOver) => Ownership::TakenOver,
            Some(_) => Ownership::Ours,
        }
    }

    /// A holder as the operator API reports it, from what the scripts answered.
    fn holder(&self, lock: &str, holding: Holding) -> Holder {
        let watched = self.channels.is_watched(&channel_of(lock));
        Holder {
            owner: holding.owner,
            fencing_token: holding.token,
            ttl: Duration::from_millis(u64::try_from(holding.pttl_ms).unwrap_or(0)),
            label: Some(holding.label).filter(|label| !label.is_empty()),
            waited_on: holding.waited_on,
            waiting: Some(u64::from(watched)),
            shared: holding.shared,
        }
    }
}

/// A value distlock did not write: only a bug can put one in this process's keyspace.
fn foreign(key: &str) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: format!("the in-process lock {key} holds a value distlock did not write").into(),
    }
}

impl Engine for InProcessEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
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
        Box::pin(future::ready(Ok(self.release_now(key, owner, kind))))
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        let calls: Vec<RenewCall> = batch
            .iter()
            .map(|item| RenewCall {
                lock: self.lock(item.key),
                owner: match item.kind.is_shared() {
                    true => self.member(item.owner),
                    false => item.owner.as_str().to_owned(),
                },
                shared: item.kind.is_shared(),
                ttl_ms: millis::arg(item.ttl),
            })
            .collect();
        let answers = self.run(|keys, _, _| scripts::renew(keys, &calls));
        let found = answers
            .into_iter()
            .map(|answer| Some(answer.into()))
            .collect();
        Box::pin(future::ready(Ok(found)))
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        let lock = self.lock(key);
        let found = self.run(|keys, _, _| scripts::inspect(keys, &lock));
        let holder = found
            .map(|holding| holding.map(|holding| self.holder(&lock, holding)))
            .map_err(|_| foreign(key));
        Box::pin(future::ready(holder))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        // Releases notify under no lock of the waiter's, and registration is immediate: in force
        // as soon as it returns, on the one in-process link (epoch 0).
        let channel = channel_of(&self.lock(key));
        let watch = self.channels.register(&channel, None);
        self.channels.confirm(&channel, 0);
        Box::pin(future::ready(Ok(watch)))
    }

    fn answers_at_once(&self) -> bool {
        true
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<crate::Finding>>> {
        // Nothing to configure: the map lives and dies with the process, as documented.
        Box::pin(future::ready(Ok(Vec::new())))
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        let prefix = format!("{}:{{", self.prefix);
        let mut held = self.run(|keys, _, _| {
            let locks = keys.keys(|name| name.starts_with(&prefix) && name.ends_with('}'));
            locks
                .into_iter()
                .filter_map(|lock| {
                    let key = lock[prefix.len()..lock.len() - 1].to_owned();
                    let holding = scripts::inspect(keys, &lock).ok().flatten();
                    (glob_match(pattern, &key) && holding.is_some()).then_some(key)
                })
                .collect::<Vec<String>>()
        });
        held.sort_unstable();
        Box::pin(future::ready(Ok(held)))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        let lock = self.lock(key);
        let removed =
            self.run(|keys, settings, published| scripts::unlock(keys, settings, &lock, published));
        let holder = removed
            .map(|holding| holding.map(|holding| self.holder(&lock, holding)))
            .map_err(|_| foreign(key));
        Box::pin(future::ready(holder))
    }

    fn follow<'a>(
        &'a self,
        _key: &'a str,
        _notifications: Notifications,
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

/// What this engine shows the test suite (`SharedHooks::show`).
#[cfg(distlock_test_hooks)]
impl InProcessEngine {
    pub(crate) fn watched_channels(&self) -> u64 {
        self.channels.watched() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Released locks leave their token markers for the marker TTL, then nothing: memory stays
    /// bounded by the keys used recently.
    #[test]
    fn markers_are_forgotten_after_their_ttl() {
        let store = InProcessEngine::new("t", Duration::from_millis(1), "", true);
        for i in 0..1_000 {
            let owner = Owner::random();
            let key = format!("k{i}");
            let ttl = Duration::from_secs(1);
            let acquired = store.acquire_now(&key, &owner, ttl, Asker::Once, LockKind::Exclusive);
            assert!(matches!(acquired, Ok(Acquired::Yes { .. })));
            assert_eq!(
                store.release_now(&key, &owner, LockKind::Exclusive),
                Ownership::Ours
            );
        }
        // No event marks a TTL running out; waiting it out is the point.
        std::thread::sleep(Duration::from_millis(5));
        let left = store.run(|keys, _, _| keys.keys(|_| true).len());
        assert_eq!(left, 0);
    }
}
