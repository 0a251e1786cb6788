//! [`EtcdStore`]: the queue engine's [`Store`] on etcd — each lock's queue a prefix of keys,
//! each bound to a lease (`leases.rs`), joined, left and renewed by transactions (`txns.rs`),
//! its deletions told by an etcd watch.

use super::client::Connection;
use super::leases::{self, Pool, Rounding};
use super::txns::{key_of, Queue};
use super::url::EtcdSpec;
use crate::engines::engine::{EngineFailure, EngineResult, Renewal};
use crate::engines::queue::order::Entry;
use crate::engines::queue::store::{Deletion, Deletions, Presence, Read, Store};
use crate::engines::settings::{Timeouts, TlsFiles};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::KeyEventSender;
use etcd_client::{
    EventType, GetOptions, TxnOp, TxnOpResponse, TxnResponse, WatchFilterType, WatchOptions,
};
use futures_util::StreamExt;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Renewals in one etcd transaction (etcd refuses more than 128 operations in one, by default).
const RENEWALS_PER_TXN: usize = 64;

pub(crate) struct EtcdStore {
    pub(super) connection: Arc<Connection>,
    prefix: String,
    label: String,
    rounding: Rounding,
    pool: Pool,
}

impl EtcdStore {
    pub(crate) fn new(
        spec: &EtcdSpec,
        tls: &TlsFiles,
        prefix: &str,
        timeouts: Timeouts,
        label: &str,
    ) -> EtcdStore {
        EtcdStore {
            connection: Arc::new(Connection::new(spec.clone(), tls.clone(), prefix, timeouts)),
            prefix: prefix.to_owned(),
            label: label.to_owned(),
            rounding: Rounding::default(),
            pool: Pool::default(),
        }
    }

    pub(super) fn queue(&self, key: &str) -> Queue {
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

    async fn txn(&self, txn: etcd_client::Txn) -> EngineResult<TxnResponse> {
        self.connection
            .call(|mut client| async move { client.txn(txn).await })
            .await
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
        answers: &mut [Option<Presence>],
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
            for (((at, _), queue), reply) in replies {
                let TxnOpResponse::Txn(reply) = reply else {
                    continue;
                };
                answers[*at] = Some(presence(reply.succeeded(), queue, &reply));
            }
        }
        Ok(())
    }
}

/// Whether the entry a transaction looked for was there; when not, whether the head the
/// transaction read instead holds the queue.
fn presence(succeeded: bool, queue: &Queue, reply: &TxnResponse) -> Presence {
    match succeeded {
        true => Presence::Present,
        false => Presence::Absent {
            held: !queue.last_read(reply).is_empty(),
        },
    }
}

impl Store for EtcdStore {
    type Lease = i64;

    async fn join(
        &self,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<Read<i64>> {
        let queue = self.queue(key);
        let lease = self.lease(ttl).await?;
        let joined = self
            .txn_on(lease, queue.join(owner, kind, lease, &self.label))
            .await?;
        Ok(Read {
            entries: queue.last_read(&joined),
            at: joined.header().map_or(0, |header| header.revision()) as u64,
        })
    }

    async fn leave(&self, key: &str, owner: &Owner) -> EngineResult<Presence> {
        let queue = self.queue(key);
        let left = self.txn(queue.leave(owner)).await?;
        Ok(presence(left.succeeded(), &queue, &left))
    }

    async fn renew(&self, batch: &[Renewal<'_>]) -> EngineResult<Vec<Option<Presence>>> {
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
    }

    async fn read(&self, key: &str) -> EngineResult<Vec<Entry<i64>>> {
        let queue = self.queue(key);
        let read = self
            .txn(etcd_client::Txn::new().and_then([queue.read()]))
            .await?;
        Ok(queue.last_read(&read))
    }

    async fn remove(&self, key: &str, entry: &Entry<i64>) -> EngineResult<bool> {
        let removed = self.txn(self.queue(key).remove(entry)).await?;
        Ok(removed.succeeded())
    }

    /// etcd answers in whole seconds, cut off, so the lease lasts less than a second more
    /// than it says: that second is added, up to the lease's full TTL.
    async fn time_left(&self, _key: &str, entry: &Entry<i64>) -> Option<Duration> {
        let lease = entry.lease;
        let answer = self
            .connection
            .call(|mut client| async move { client.lease_time_to_live(lease, None).await })
            .await
            .ok()?;
        let left = u64::try_from(answer.ttl()).ok()?;
        let full = u64::try_from(answer.granted_ttl()).unwrap_or(left);
        Some(Duration::from_secs((left + 1).min(full.max(left))))
    }

    /// One etcd watch of the queue's prefix, without puts, confirmed by etcd's `created` reply.
    async fn deletions(&self, key: &str) -> EngineResult<Deletions> {
        let queue = self.queue(key);
        let client = self.connection.client().await?;
        let options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = client
            .watch_client()
            .watch(queue.start.as_str(), Some(options))
            .await
            .map_err(EngineFailure::ambiguous)?;
        let created = stream.message().await.map_err(EngineFailure::ambiguous)?;
        if !created.is_some_and(|reply| reply.created() && !reply.canceled()) {
            return Err(EngineFailure::ambiguous("etcd refused the watch"));
        }
        // Each reply's deletions, until the stream breaks or etcd cancels the watch.
        let replies = futures_util::stream::unfold((stream, queue), |(mut stream, queue)| async {
            let reply = stream.message().await.ok()??;
            if reply.canceled() {
                return None;
            }
            let deleted: Vec<Deletion> = reply
                .events()
                .iter()
                .filter(|event| matches!(event.event_type(), EventType::Delete))
                .filter_map(|event| {
                    let kv = event.kv()?;
                    Some(Deletion {
                        owner: String::from_utf8_lossy(queue.owner_of(kv.key())?).into_owned(),
                        at: kv.mod_revision() as u64,
                    })
                })
                .collect();
            Some((deleted, (stream, queue)))
        });
        Ok(replies.flat_map(futures_util::stream::iter).boxed())
    }

    async fn keys(&self) -> EngineResult<Vec<String>> {
        let start = format!("{}:{{", self.prefix);
        let read = self
            .connection
            .call(|mut client| {
                let start = start.clone();
                async move {
                    let options = GetOptions::new().with_prefix().with_keys_only();
                    client.get(start, Some(options)).await
                }
            })
            .await?;
        Ok(read
            .kvs()
            .iter()
            .filter_map(|kv| key_of(&self.prefix, std::str::from_utf8(kv.key()).ok()?))
            .map(str::to_owned)
            .collect())
    }

    async fn follow(&self, key: &str, events: KeyEventSender) -> EngineResult<()> {
        self.follow_key(key, events).await
    }

    async fn doctor(&self) -> EngineResult<Vec<Finding>> {
        self.diagnose().await
    }
}
