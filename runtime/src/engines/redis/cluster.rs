//! Redis Cluster: every lock lives on the node that owns its slot.
//!
//! A lock's keys share a hash tag (`<prefix>:{<key>}` and its channel), so each script call
//! touches one slot, and redis-rs's cluster client routes it to that slot's master — following
//! `MOVED`/`ASK` when the slot moved and refreshing its slot map. Multi-key locks take their keys
//! one by one in canonical order (`acquire.rs`), so keys in different slots never meet in one
//! call and no `CROSSSLOT` reaches a user.
//!
//! Renewal is grouped: the watchdog's batch is split by slot (one `renew.lua` call per slot, all
//! of that slot's leases in it), the slots by the master that owns them (from `CLUSTER SLOTS`),
//! and each master gets its calls as one pipeline — one round trip per master holding leases per
//! period. A slot that answers `MOVED` (it migrated since the map was read) is renewed again on
//! its own, routed by the client to the new owner, and the map is read again: a lease is renewed
//! where its slot lives, or stays undecided (renewed again at the next chance) until its
//! validity runs out and it is reported lost. A master that does not answer costs only the
//! leases on it: each master's round is bounded by two response timeouts.
//!
//! Release notifications use sharded pub/sub ([`ShardedSubscriber`]).

use super::cluster_spec::ClusterSpec;
use super::node::{reservation_window, settle_release, settle_transfer, Node, Place};
use super::sharded::ShardedSubscriber;
use super::slot::slot_of;
use crate::engines::engine::{
    Acquired, Asker, Engine, EngineResult, GrantedAs, Holder, Ownership, Renewal, Transfer,
};
use crate::engines::settings::Timeouts;
use crate::error::LockError;
use crate::hooks::SharedHooks;
use crate::lock::key::{lock_name, KeyNames};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::wait::{Channels, ReleaseWatch, Successor};
use futures_util::future::{join_all, BoxFuture};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Where and how the cluster engine connects.
pub(crate) struct ClusterConfig<'a> {
    pub(crate) spec: &'a ClusterSpec,
    pub(crate) prefix: &'a str,
    pub(crate) marker_ttl: Duration,
    pub(crate) timeouts: Timeouts,
    pub(crate) hooks: SharedHooks,
    /// Written with every lock, for operators.
    pub(crate) holder_label: &'a str,
    /// Exclusive locks carry fencing tokens (`false`: efficiency locks).
    pub(crate) fenced: bool,
    /// The grant time: how long a queued waiter's place, and a lock handed over to it, last
    /// unless it asks (or confirms) ([`handover_grant`](crate::lock::policy::handover_grant)).
    pub(crate) handover_grant: Duration,
}

pub(crate) struct ClusterEngine {
    pub(super) node: Arc<Node>,
    pub(super) prefix: String,
    pub(super) marker_ttl: Duration,
    /// The seeds and credentials, for connections to single nodes (keyspace followers).
    pub(super) spec: ClusterSpec,
    subscriber: Arc<ShardedSubscriber>,
    /// Which master owns each slot, as `CLUSTER SLOTS` said; empty until read, and emptied
    /// when a renewal finds a slot elsewhere.
    owners: Mutex<SlotOwners>,
    pub(super) timeouts: Timeouts,
    /// Renewal round trips (pipelines and single calls) sent, for tests of the grouping.
    renewal_round_trips: AtomicU64,
    hooks: SharedHooks,
    publish_refused: AtomicBool,
}

/// Per slot of a renewal: the leases' places in the batch, and what renewing them found.
type SlotAnswers = Vec<(Vec<usize>, EngineResult<Vec<Option<Ownership>>>)>;

/// The leases of one slot in a renewal: their lock keys and their places in the batch.
struct SlotLeases {
    slot: u16,
    locks: Vec<String>,
    indices: Vec<usize>,
}

/// Slot ranges and the `host:port` of their master, sorted by the first slot.
#[derive(Default)]
struct SlotOwners {
    ranges: Vec<(u16, u16, String)>,
}

impl SlotOwners {
    fn owner(&self, slot: u16) -> Option<&str> {
        let at = self.ranges.partition_point(|(start, _, _)| *start <= slot);
        let (start, end, owner) = self.ranges.get(at.checked_sub(1)?)?;
        (*start <= slot && slot <= *end).then_some(owner.as_str())
    }
}

impl ClusterEngine {
    pub(crate) fn open(config: ClusterConfig<'_>) -> Result<Self, LockError> {
        let spec = config.spec.clone();
        let client = spec.builder(config.timeouts).build().map_err(|err| {
            LockError::invalid_config("url", format!("the cluster client refused it: {err}"))
        })?;
        let node = Arc::new(
            Node::cluster(client, config.timeouts, config.prefix)
                .with_label(config.holder_label)
                .with_fencing(config.fenced)
                .with_queue(config.handover_grant, true),
        );
        Ok(ClusterEngine {
            subscriber: ShardedSubscriber::new(
                spec.clone(),
                config.timeouts,
                config.prefix,
                Arc::new(Channels::needing(1)),
            ),
            node,
            spec,
            prefix: config.prefix.to_owned(),
            marker_ttl: config.marker_ttl,
            owners: Mutex::default(),
            timeouts: config.timeouts,
            renewal_round_trips: AtomicU64::new(0),
            hooks: config.hooks,
            publish_refused: AtomicBool::new(false),
        })
    }

    fn reservation_window(&self) -> Duration {
        reservation_window(&self.hooks)
    }

    /// The slot map, read with `CLUSTER SLOTS` if it is not known.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only (`CLUSTER SLOTS`): dropping the future leaves the map unread, for the next caller
    /// to read.
    pub(super) async fn owners(&self) -> EngineResult<Vec<(u16, u16, String)>> {
        {
            let owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
            if !owners.ranges.is_empty() {
                return Ok(owners.ranges.clone());
            }
        }
        let mut conn = self.node.cluster_connection().await?;
        let reply = conn
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await
            .and_then(Value::extract_error)
            .map_err(|err| crate::engines::engine::EngineFailure {
                ambiguous: false,
                source: format!("CLUSTER SLOTS: {err}").into(),
            })?;
        let mut ranges = parse_cluster_slots(reply);
        ranges.sort_unstable();
        let mut owners = self.owners.lock().unwrap_or_else(|e| e.into_inner());
        owners.ranges = ranges.clone();
        Ok(ranges)
    }

    fn forget_owners(&self) {
        self.owners
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .ranges
            .clear();
    }

    /// Renews the leases of several slots, all (by the map) on one master, in one pipeline;
    /// a slot whose call failed there (it moved, the node broke) is renewed again on its own,
    /// routed by the client. A node without the script (first use, a promoted replica) gets the
    /// pipeline once more, its first call carrying the source, which loads it for the others.
    /// Answers per slot, in order.
    ///
    /// # Cancel safety
    /// Cancel safe: no lease relies on a renewal that was not confirmed.
    /// Dropped (by the per-master bound in `renew`), the renewals already sent may still extend
    /// their leases on the server, as with lost replies; those leases are answered undecided and
    /// renewed again soon.
    async fn renew_on_master(&self, slots: Vec<SlotLeases>, batch: &[Renewal<'_>]) -> SlotAnswers {
        let all: Vec<usize> = (0..slots.len()).collect();
        let mut replies = self.renewal_pipeline(&slots, &all, batch, false).await;
        let unloaded: Vec<usize> = replies
            .iter()
            .enumerate()
            .filter(|(_, reply)| matches!(reply, Some(reply) if is_noscript(reply)))
            .map(|(index, _)| index)
            .collect();
        if !unloaded.is_empty() {
            let again = self.renewal_pipeline(&slots, &unloaded, batch, true).await;
            for (index, reply) in unloaded.into_iter().zip(again) {
                replies[index] = reply;
            }
        }
        // Slots elsewhere now, or not answered: once more each, on its own (all at once),
        // routed by the client to the slot's current owner; and the map is read again.
        let answers = slots
            .into_iter()
            .zip(replies)
            .map(|(leases, reply)| async move {
                let parsed = reply.map(|reply| Node::renew_answers(reply, leases.indices.len()));
                let answer = match parsed {
                    Some(Ok(found)) => Ok(found.into_iter().map(Some).collect()),
                    _ => {
                        self.forget_owners();
                        self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
                        let items: Vec<Renewal<'_>> =
                            leases.indices.iter().map(|&i| batch[i]).collect();
                        self.node.renew(&leases.locks, &items).await
                    }
                };
                (leases.indices, answer)
            });
        join_all(answers).await
    }

    /// One pipeline of `renew.lua` calls, for the slots at `which`, to the master of the first
    /// of them; `None` for a slot whose reply did not come. `load`: the first call carries the
    /// script's source.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// As [`renew_on_master`](Self::renew_on_master): a pipeline already sent may still extend its
    /// leases; nothing else is left behind.
    async fn renewal_pipeline(
        &self,
        slots: &[SlotLeases],
        which: &[usize],
        batch: &[Renewal<'_>],
        load: bool,
    ) -> Vec<Option<Value>> {
        let mut pipe = redis::pipe();
        for (position, &index) in which.iter().enumerate() {
            let leases = &slots[index];
            let items: Vec<Renewal<'_>> = leases.indices.iter().map(|&i| batch[i]).collect();
            pipe.add_command(
                self.node
                    .renew_command(&leases.locks, &items, load && position == 0),
            );
        }
        let route =
            SingleNodeRoutingInfo::SpecificNode(Route::new(slots[which[0]].slot, SlotAddr::Master));
        self.renewal_round_trips.fetch_add(1, Ordering::Relaxed);
        let sent = match self.node.cluster_connection().await {
            Ok(mut conn) => conn.route_pipeline(pipe, 0, which.len(), route).await.ok(),
            Err(_) => None,
        };
        match sent {
            Some(values) if values.len() == which.len() => values.into_iter().map(Some).collect(),
            _ => vec![None; which.len()],
        }
    }

    /// Renewal round trips sent so far.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn renewal_round_trips(&self) -> u64 {
        self.renewal_round_trips.load(Ordering::Relaxed)
    }

    /// Release-notification channels with a local watcher.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn watched_channels(&self) -> u64 {
        self.subscriber.watched() as u64
    }
}

/// A `NOSCRIPT` error reply: the node does not have the script (yet).
fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err) if err.code() == "NOSCRIPT")
}

/// `CLUSTER SLOTS`: `[[start, end, [host, port, id, …], replicas…], …]` → `(start, end,
/// "host:port")`.
pub(super) fn parse_cluster_slots(reply: Value) -> Vec<(u16, u16, String)> {
    let Value::Array(entries) = reply else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let Value::Array(fields) = entry else {
                return None;
            };
            let int = |value: &Value| match value {
                Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
            let Value::Array(master) = fields.get(2)? else {
                return None;
            };
            let host = match master.first()? {
                Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok()?,
                Value::SimpleString(text) => text.clone(),
                _ => return None,
            };
            let port = int(master.get(1)?)?;
            Some((start, end, format!("{host}:{port}")))
        })
        .collect()
}

impl Engine for ClusterEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(async move {
            let names = KeyNames::new(&self.prefix, key);
            if kind.is_shared() {
                return self
                    .node
                    .acquire_shared(&names.lock, owner, ttl, asker, kind)
                    .await;
            }
            self.node
                .acquire(&names, owner, ttl, 1, asker, Place::Behind)
                .await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>> {
        Box::pin(async move {
            let names = KeyNames::new(&self.prefix, key);
            let window = self.reservation_window();
            let reply = if kind.is_shared() {
                self.node
                    .release_shared(&names.lock, owner, self.marker_ttl, window)
                    .await?
            } else {
                self.node
                    .release(&names, owner, granted, self.marker_ttl, window)
                    .await?
            };
            Ok(settle_release(
                reply,
                &self.publish_refused,
                &self.prefix,
                &names.lock,
            ))
        })
    }

    fn transfers(&self) -> bool {
        self.node.grants_in_release()
    }

    fn transfer<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        successor: &'a Successor,
    ) -> BoxFuture<'a, EngineResult<Transfer>> {
        Box::pin(async move {
            let names = KeyNames::new(&self.prefix, key);
            let window = self.reservation_window();
            let reply = if self.transfers() {
                self.node
                    .transfer(&names, owner, successor, self.marker_ttl, window)
                    .await?
            } else {
                let granted = GrantedAs::Unknown;
                self.node
                    .release(&names, owner, granted, self.marker_ttl, window)
                    .await?
            };
            Ok(settle_transfer(
                reply,
                &self.publish_refused,
                &self.prefix,
                &names.lock,
            ))
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        Box::pin(async move {
            // Leases by slot: one script call per slot.
            let mut by_slot: BTreeMap<u16, (Vec<String>, Vec<usize>)> = BTreeMap::new();
            for (index, item) in batch.iter().enumerate() {
                let lock = lock_name(&self.prefix, item.key);
                let entry = by_slot.entry(slot_of(&lock)).or_default();
                entry.0.push(lock);
                entry.1.push(index);
            }
            // Slots by master: one round trip per master. Without a map (it could not be
            // read), every slot goes on its own, routed by the client.
            let owners = SlotOwners {
                ranges: self.owners().await.unwrap_or_default(),
            };
            let mut by_master: BTreeMap<String, Vec<SlotLeases>> = BTreeMap::new();
            for (slot, (locks, indices)) in by_slot {
                let master = owners
                    .owner(slot)
                    .map_or_else(|| format!("slot {slot}"), str::to_owned);
                by_master.entry(master).or_default().push(SlotLeases {
                    slot,
                    locks,
                    indices,
                });
            }
            // Each master's round is bounded, so that a master that does not answer (blackholed,
            // not refusing) costs the leases on it a renewal, never those on the others: its
            // leases stay undecided and are renewed again soon.
            let bound = self.timeouts.response * 2;
            let rounds = by_master.into_values().map(|slots| {
                let undecided: SlotAnswers = slots
                    .iter()
                    .map(|leases| (leases.indices.clone(), Ok(vec![None; leases.indices.len()])))
                    .collect();
                async move {
                    tokio::time::timeout(bound, self.renew_on_master(slots, batch))
                        .await
                        .unwrap_or(undecided)
                }
            });
            let mut answers: Vec<Option<Ownership>> = vec![None; batch.len()];
            let mut failures = Vec::new();
            for (indices, answer) in join_all(rounds).await.into_iter().flatten() {
                match answer {
                    Ok(found) => {
                        for (index, found) in indices.into_iter().zip(found) {
                            answers[index] = found;
                        }
                    }
                    Err(failure) => failures.push(failure),
                }
            }
            // Leases whose slot could not be reached stay undecided (renewed again soon); if
            // none could, the whole renewal failed.
            if answers.iter().all(Option::is_none) {
                if let Some(failure) = failures.into_iter().next() {
                    return Err(failure);
                }
            }
            Ok(answers)
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(async move { self.node.inspect(&KeyNames::new(&self.prefix, key)).await })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        Box::pin(async move {
            let channel = KeyNames::new(&self.prefix, key).channel;
            let watch = self.subscriber.register(&channel);
            self.subscriber.subscribe_and_confirm(&channel).await?;
            Ok(watch)
        })
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<Finding>>> {
        Box::pin(async move { self.node.doctor().await })
    }

    fn rights(&self) -> BoxFuture<'_, Vec<Finding>> {
        Box::pin(self.node.check_acl())
    }

    fn close_links(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.subscriber.close())
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        Box::pin(self.scan_masters(pattern))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(async move {
            let names = KeyNames::new(&self.prefix, key);
            self.node.force_unlock(&names, self.marker_ttl).await
        })
    }

    fn follow<'a>(
        &'a self,
        key: &'a str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(self.follow_slot_owner(key, notifications, events))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_owners_are_found_by_range() {
        let owners = SlotOwners {
            ranges: vec![
                (0, 5460, "a:1".into()),
                (5461, 10922, "b:1".into()),
                (10923, 16383, "c:1".into()),
            ],
        };
        assert_eq!(owners.owner(0), Some("a:1"));
        assert_eq!(owners.owner(5461), Some("b:1"));
        assert_eq!(owners.owner(16383), Some("c:1"));
        assert_eq!(SlotOwners::default().owner(7), None);
    }
}
