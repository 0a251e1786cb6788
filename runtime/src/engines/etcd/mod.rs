//! The etcd engine (`etcd://`, feature `etcd`): locks on a consensus store, which keeps a
//! granted lock through the loss of any minority of its members and hands out a fencing token
//! that only grows across leader changes.
//!
//! A lock is a queue of entries (`queue.rs`): each contender writes its own key bound to a
//! lease, the oldest entry holds the lock, and its creation revision is the fencing token.
//! Waiters keep their places and are woken by a watch of the queue's deletions
//! (`notify.rs`), so the lock passes in the order they came, across processes.
//!
//! Leases (`leases.rs`): every grant and every renewal binds the entry to a lease with the
//! lock's TTL left (rounded up to whole seconds); the grants and renewals of one TTL share a
//! lease for up to a second. An entry nobody renews lapses with its lease, as a Redis key with
//! its TTL.
//!

pub(crate) mod client;
mod joining;
mod leases;
mod notify;
mod operator;
pub(crate) mod queue;
pub(crate) mod spec;

use crate::engines::engine::{
    Acquired, Asker, Engine, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal,
};
use crate::engines::timeouts::Timeouts;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::key_events::KeyEventSender;
use crate::wait::ReleaseWatch;
use client::Connection;
use etcd_client::{TxnOp, TxnOpResponse, TxnResponse};
use futures_util::future::BoxFuture;
use joining::Joining;
use leases::{Pool, Rounding};
use notify::Watches;
use queue::{holds, same_family, Entry, Queue};
use spec::EtcdSpec;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Renewals in one etcd transaction (etcd refuses more than 128 operations in one, by default).
const RENEWALS_PER_TXN: usize = 64;

pub(crate) struct EtcdEngine {
    connection: Arc<Connection>,
    prefix: String,
    label: String,
    rounding: Rounding,
    pool: Pool,
    joining: Joining,
    watches: Arc<Watches>,
}

/// What an etcd engine is made with.
pub(crate) struct EtcdConfig<'a> {
    pub(crate) spec: &'a EtcdSpec,
    pub(crate) prefix: &'a str,
    pub(crate) timeouts: Timeouts,
    pub(crate) holder_label: &'a str,
}

impl EtcdEngine {
    pub(crate) fn open(config: EtcdConfig<'_>) -> EtcdEngine {
        let connection = Arc::new(Connection::new(config.spec.clone(), config.timeouts));
        EtcdEngine {
            watches: Watches::new(connection.clone(), config.timeouts.response),
            connection,
            prefix: config.prefix.to_owned(),
            label: config.holder_label.to_owned(),
            rounding: Rounding::default(),
            pool: Pool::default(),
            joining: Joining::default(),
        }
    }

    fn queue(&self, key: &str) -> Queue {
        Queue::of(&self.prefix, key)
    }

    /// A lease with at least `ttl` left: the one shared by this TTL's grants and renewals, or
    /// a new one.
    ///
    /// # Cancel safety
    /// Cancel safe: a lease granted for a dropped call binds nothing and ends with its TTL.
    async fn lease(&self, ttl: Duration) -> EngineResult<i64> {
        if let Some(id) = self.pool.take(ttl) {
            return Ok(id);
        }
        let seconds = leases::asked(ttl);
        let asked_at = Instant::now();
        let granted = self
            .connection
            .call(|mut client| async move { client.lease_grant(seconds, None).await })
            .await?;
        self.rounding.granted(ttl, granted.ttl());
        self.pool.put(ttl, granted.id(), asked_at, granted.ttl());
        Ok(granted.id())
    }

    /// Runs `txn`, which binds entries to `lease`: a failure stops the lease being shared.
    async fn txn_on(&self, lease: i64, txn: etcd_client::Txn) -> EngineResult<TxnResponse> {
        let answer = self.txn(txn).await;
        if answer.is_err() {
            self.pool.forget(lease);
        }
        answer
    }

    /// How long `lease` lasts at most (`None`: it is gone or etcd did not say). etcd answers
    /// in whole seconds, cut off, so the lease lasts less than a second more than it says:
    /// that second is added, up to the lease's full TTL.
    async fn time_left(&self, lease: i64) -> Option<Duration> {
        let answer = self
            .connection
            .call(|mut client| async move { client.lease_time_to_live(lease, None).await })
            .await
            .ok()?;
        let left = u64::try_from(answer.ttl()).ok()?;
        let full = u64::try_from(answer.granted_ttl()).unwrap_or(left);
        Some(Duration::from_secs((left + 1).min(full.max(left))))
    }

    async fn txn(&self, txn: etcd_client::Txn) -> EngineResult<TxnResponse> {
        self.connection
            .call(|mut client| async move { client.txn(txn).await })
            .await
    }

    /// Joins `key`'s queue as `kind` (or keeps the place in it) with a new lease, and answers
    /// whether the caller holds the lock now.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: the join runs to its end in a task of its own, and the caller's
    /// background release of the entry waits for it (`joining.rs`); a single try's removal of
    /// its entry, dropped, is that release's to do.
    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        let queue = self.queue(key);
        let lease = self.lease(ttl).await?;
        let txn = queue.join(owner, kind, lease, &self.label);
        let joined = self
            .joining
            .send(&self.connection, queue.entry(owner), txn)
            .await;
        if joined.is_err() {
            self.pool.forget(lease);
        }
        let joined = joined?;
        let entries = queue.last_read(&joined);
        let mine = entries
            .iter()
            .position(|entry| entry.owner == owner.as_str());
        let Some(place) = mine else {
            // Written and gone within the transaction: impossible; read as a lost reply.
            return Err(client::transient(
                "the queue entry just written was not read back",
            ));
        };
        if entries.iter().any(|entry| !same_family(kind, entry.kind)) {
            self.txn(queue.remove(&entries[place])).await?;
            return Err(EngineFailure::kind_mismatch(key, kind));
        }
        if holds(&entries, place) {
            return Ok(Acquired::Yes {
                fence: entries[place].revision as u64,
            });
        }
        let holder_ttl = self.time_left(entries[0].lease).await;
        if asker == Asker::Once {
            // A single try does not queue.
            self.txn(queue.remove(&entries[place])).await?;
            return Ok(busy(holder_ttl, None));
        }
        // A writer waits for the entry just ahead of it; readers and permits for any.
        let predecessor = (kind == LockKind::Exclusive).then(|| queue.name(&entries[place - 1]));
        let read_at = joined.header().map_or(0, |header| header.revision());
        self.watches.wait_behind(&queue.start, predecessor, read_at);
        Ok(busy(holder_ttl, Some(ttl)))
    }

    /// Renews one batch of leases of the same TTL under one new lease.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: entries may have moved to the new lease, each then held at least its
    /// TTL from the request, as a renewal asks; the watchdog counts the batch as a failed
    /// renewal and tries again.
    async fn renew_all(
        &self,
        ttl: Duration,
        batch: &[(usize, &Renewal<'_>)],
        answers: &mut [Option<Ownership>],
    ) -> EngineResult<()> {
        let lease = self.lease(ttl).await?;
        for chunk in batch.chunks(RENEWALS_PER_TXN) {
            let queues: Vec<Queue> = chunk.iter().map(|(_, r)| self.queue(r.key)).collect();
            let ops: Vec<TxnOp> = chunk
                .iter()
                .zip(&queues)
                .map(|((_, renewal), queue)| TxnOp::txn(queue.renew(renewal.owner, lease)))
                .collect();
            let done = self
                .txn_on(lease, etcd_client::Txn::new().and_then(ops))
                .await?;
            let replies = chunk.iter().zip(&queues).zip(done.op_responses());
            for (((at, renewal), queue), reply) in replies {
                let TxnOpResponse::Txn(reply) = reply else {
                    continue;
                };
                answers[*at] = Some(match reply.succeeded() {
                    true => Ownership::Ours,
                    false => found(renewal.kind, &queue.last_read(&reply)),
                });
            }
        }
        Ok(())
    }
}

/// A busy reply: the holder's time left and, for a waiter, how long its place lasts.
fn busy(holder_ttl: Option<Duration>, place: Option<Duration>) -> Acquired {
    Acquired::Busy {
        ttl: holder_ttl,
        reserved: false,
        next: place,
        anew: false,
    }
}

/// What the caller's entry being gone means: for a writer, another holds the lock, or nobody
/// does; a reader's or a permit's entry is simply gone (others may hold the key with it).
fn found(kind: LockKind, head: &[Entry]) -> Ownership {
    match kind.is_shared() || head.is_empty() {
        true => Ownership::Gone,
        false => Ownership::TakenOver,
    }
}

impl Engine for EtcdEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(async move { self.join(key, owner, ttl, asker, kind).await })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        _granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>> {
        Box::pin(async move {
            let queue = self.queue(key);
            // After the caller's join, if one is on its way: the delete must not overtake it.
            self.joining.settled(&queue.entry(owner)).await;
            let left = self.txn(queue.leave(owner)).await?;
            Ok(match left.succeeded() {
                true => Ownership::Ours,
                false => found(kind, &queue.last_read(&left)),
            })
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        Box::pin(async move {
            // One new lease per TTL in the batch (one, where every lease is the watchdog's).
            let mut by_ttl: BTreeMap<Duration, Vec<(usize, &Renewal<'_>)>> = BTreeMap::new();
            for (at, renewal) in batch.iter().enumerate() {
                by_ttl.entry(renewal.ttl).or_default().push((at, renewal));
            }
            let mut answers = vec![None; batch.len()];
            for (ttl, renewals) in by_ttl {
                self.renew_all(ttl, &renewals, &mut answers).await?;
            }
            Ok(answers)
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(self.inspect_key(key))
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        Box::pin(async move { self.watches.watch(&self.queue(key).start).await })
    }

    #[cfg(distlock_test_hooks)]
    fn watched_channels(&self) -> usize {
        self.watches.watched()
    }

    /// A waiting writer's entry holds new readers back for as long as it is in the queue.
    fn writer_intent_lapses(&self) -> bool {
        false
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<crate::operating::doctor::Finding>>> {
        Box::pin(self.diagnose())
    }

    fn close_links(&self) -> BoxFuture<'_, ()> {
        Box::pin(async { self.watches.close() })
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        Box::pin(self.list_keys(pattern))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(self.unlock(key))
    }

    fn follow<'a>(
        &'a self,
        key: &'a str,
        _enable: bool,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(self.follow_key(key, events))
    }
}
