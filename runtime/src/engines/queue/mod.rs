//! The queue engine: one [`Engine`] for every store that orders entries (etcd, PostgreSQL,
//! MySQL, ZooKeeper).
//!
//! A lock is a queue of entries in the store ([`Store`]): each contender writes one, bound to
//! a time the store keeps (a lease, an expiry), and the store numbers it in the order entries
//! are written. Who holds the lock follows from that order alone (`order.rs`), and the number
//! is the holder's fencing token. A waiter keeps its entry, and with it its place; it is woken
//! when an entry ahead of it goes (`watches.rs`), so the lock passes in the order contenders
//! came, across processes. A single try that finds the lock busy deletes its entry again.
//!
//! The store does only what it alone can — join, leave, renew a batch, read, remove an entry
//! if it is still the one read, tell of deletions, say how long an entry lives; this module
//! decides who holds, joins (`joining.rs`: a leave never overtakes its join), wakes, and
//! answers the operators (`operator.rs`).
// Built without a store only under the test hooks, for the model checker, which runs `order`.
#![cfg_attr(
    not(any(
        feature = "etcd",
        feature = "postgres",
        feature = "mysql",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]

mod joining;
mod operator;
pub(crate) mod order;
pub(crate) mod store;
mod watches;

use crate::engines::engine::{
    Acquired, Asker, Engine, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal,
};
use crate::engines::settings::EngineSettings;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::wait::ReleaseWatch;
use futures_util::future::BoxFuture;
use joining::Joining;
use order::{holds, same_family};
use std::sync::Arc;
use std::time::Duration;
use store::{Presence, Store};
use watches::Watches;

pub(crate) struct QueueEngine<S: Store> {
    store: Arc<S>,
    joining: Joining,
    watches: Arc<Watches<S>>,
}

impl<S: Store> QueueEngine<S> {
    /// The engine on `store`; a watch the store has not confirmed within `response` leaves
    /// its waiter on backoff until its next watch.
    pub(crate) fn new(store: S, response: Duration) -> QueueEngine<S> {
        let store = Arc::new(store);
        QueueEngine {
            watches: Watches::new(store.clone(), response),
            store,
            joining: Joining::default(),
        }
    }

    /// The engine on `store`, as a deployment opens it: with the response timeout of
    /// `settings`, and its watched channels shown to the test hooks.
    pub(crate) fn open(store: S, settings: &EngineSettings<'_>) -> Arc<dyn Engine> {
        let engine = Arc::new(QueueEngine::new(store, settings.timeouts.response));
        #[cfg(distlock_test_hooks)]
        settings.hooks.show(
            crate::hooks::Probe::WatchedChannels,
            &engine,
            QueueEngine::watched_channels,
        );
        engine
    }

    /// Joins `key`'s queue as `kind` (or keeps the place in it), and answers whether the
    /// caller holds the lock now.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: the join — the store's lease, if it asks for one, and its write —
    /// runs to its end in a task of its own, and the caller's background release of the entry
    /// waits for it (`joining.rs`); a single try's removal of its entry, dropped, is that
    /// release's to do.
    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        let read = self
            .joining
            .join(&self.store, key, owner, kind, ttl)
            .await?;
        let entries = read.entries;
        let Some(place) = entries
            .iter()
            .position(|entry| entry.owner == owner.as_str())
        else {
            // Written and gone within one step: impossible; read as a lost reply.
            return Err(EngineFailure::ambiguous(
                "the queue entry just written was not read back",
            ));
        };
        if entries.iter().any(|entry| !same_family(kind, entry.kind)) {
            self.store.remove(key, &entries[place]).await?;
            return Err(EngineFailure::kind_mismatch(key, kind));
        }
        if holds(&entries, place) {
            return Ok(Acquired::Yes {
                fence: entries[place].token,
            });
        }
        let holder_ttl = self.store.time_left(key, &entries[0]).await;
        if asker == Asker::Once {
            // A single try does not queue.
            self.store.remove(key, &entries[place]).await?;
            return Ok(Acquired::busy(holder_ttl));
        }
        // A writer waits for the entry just ahead of it; readers and permits for any.
        let predecessor = (kind == LockKind::Exclusive).then(|| entries[place - 1].owner.clone());
        self.store.waiting_behind(key, &entries[..place], kind);
        self.watches.wait_behind(key, predecessor, read.at);
        Ok(Acquired::queued(holder_ttl, ttl, false))
    }

    /// Release-notification channels with a local watcher.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn watched_channels(&self) -> u64 {
        self.watches.watched() as u64
    }
}

/// What the caller's entry being there or not means: for a writer whose entry is gone, another
/// holds the lock, or nobody does; a reader's or a permit's entry is simply gone (others may
/// hold the key with it).
fn ownership(kind: LockKind, found: Presence) -> Ownership {
    match found {
        Presence::Present => Ownership::Ours,
        Presence::Absent { held } if held && !kind.is_shared() => Ownership::TakenOver,
        Presence::Absent { .. } => Ownership::Gone,
    }
}

impl<S: Store> Engine for QueueEngine<S> {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(self.join(key, owner, ttl, asker, kind))
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        _granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>> {
        Box::pin(async move {
            // After the caller's join, if one is on its way: the delete must not overtake it.
            self.joining.settled(key, owner).await;
            let left = self.store.leave(key, owner).await?;
            Ok(ownership(kind, left))
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        Box::pin(async move {
            let found = self.store.renew(batch).await?;
            debug_assert_eq!(found.len(), batch.len(), "one answer per renewal");
            Ok(batch
                .iter()
                .zip(found)
                .map(|(renewal, found)| found.map(|found| ownership(renewal.kind, found)))
                .collect())
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(self.inspect_key(key))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        Box::pin(self.watches.watch(key))
    }

    /// A waiting writer's entry holds new readers back for as long as it is in the queue.
    fn writer_intent_lapses(&self) -> bool {
        false
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<Finding>>> {
        Box::pin(self.store.doctor())
    }

    fn sql_schema(&self) -> Option<&str> {
        self.store.sql_schema()
    }

    fn close_links(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            self.watches.close();
            self.store.close();
        })
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        Box::pin(self.list_keys(pattern))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(self.unlock(key))
    }

    /// Every write and deletion in the queue: keyspace notifications are Redis's, so there is
    /// nothing to enable.
    fn follow<'a>(
        &'a self,
        key: &'a str,
        _notifications: Notifications,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(self.store.follow(key, events))
    }
}
