//! One Redis server, or the primary of a replicated group (behind a stable address, or named by
//! Sentinel and followed across failovers): the single-instance engine.
//!
//! Every operation is one script call on one [`Node`]: a redis-rs `ConnectionManager`,
//! multiplexed (every task shares one socket) and reconnecting by itself. Concurrent acquires
//! (and releases) are coalesced into one script call ([`GroupCommit`]). Release notifications
//! arrive on a second, pub/sub connection ([`Subscriber`]), which moves with the primary.

use super::batches::{AcquireBatch, ReleaseBatch};
use super::group_commit::GroupCommit;
use super::handover_channel::HandoverChannel;
use super::keyspace;
use super::node::{settle_release, settle_transfer, LockCall, Node, ReleaseCall, ReplicaAck};
use super::pubsub::{Subscriber, SUBSCRIPTION_LINGER};
use super::sentinel::{SentinelSpec, SentinelTarget};
use crate::engines::engine::{
    Acquired, Asker, Engine, EngineResult, GrantedAs, Holder, Ownership, Renewal, Transfer,
};
use crate::engines::settings::{Timeouts, TlsFiles};
use crate::error::LockError;
use crate::hooks::SharedHooks;
use crate::lock::key::{lock_name, KeyNames};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::wait::{Channels, ReleaseWatch, Successor};
use futures_util::future::BoxFuture;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// The server a Redis engine talks to.
pub(crate) enum RedisTarget<'a> {
    /// One server's URL: `redis://`, `rediss://`, `unix://`, `redis+unix://`.
    Server(&'a str),
    /// The primary a Sentinel group names.
    Sentinel(&'a SentinelSpec),
}

/// Where and how a Redis engine connects.
pub(crate) struct RedisConfig<'a> {
    pub(crate) target: RedisTarget<'a>,
    pub(crate) prefix: &'a str,
    pub(crate) marker_ttl: Duration,
    pub(crate) timeouts: Timeouts,
    pub(crate) tls: &'a TlsFiles,
    pub(crate) hooks: SharedHooks,
    /// Grants and renewals wait for replicas (`WAIT`); `None`: they do not.
    pub(crate) replica_ack: Option<ReplicaAck>,
    /// Written with every lock, for operators.
    pub(crate) holder_label: &'a str,
    /// Exclusive locks carry fencing tokens (`false`: efficiency locks).
    pub(crate) fenced: bool,
    /// The grant time: how long a queued waiter's place, and a lock handed over to it, last
    /// unless it asks (or confirms) ([`handover_grant`](crate::lock::policy::handover_grant)).
    pub(crate) handover_grant: Duration,
}

pub(crate) struct RedisEngine {
    node: Arc<Node>,
    acquires: GroupCommit<AcquireBatch>,
    releases: GroupCommit<ReleaseBatch>,
    prefix: String,
    marker_ttl: Duration,
    hooks: SharedHooks,
    subscriber: Arc<Subscriber>,
    /// A release notification was refused (and reported) already.
    publish_refused: AtomicBool,
}

impl RedisEngine {
    pub(crate) fn open(config: RedisConfig<'_>) -> Result<Self, LockError> {
        let (node, sentinel) = match config.target {
            RedisTarget::Sentinel(spec) => {
                let target = SentinelTarget::open(
                    spec.clone(),
                    config.tls,
                    config.timeouts,
                    config.hooks.clone(),
                )?;
                let node = Node::sentinel(target.clone(), config.timeouts, config.prefix);
                (node, Some(target))
            }
            RedisTarget::Server(url) => {
                let node = Node::open(url, config.tls, config.timeouts, config.prefix)?;
                (node, None)
            }
        };
        let node = Arc::new(
            node.with_replica_ack(config.replica_ack)
                .with_label(config.holder_label)
                .with_fencing(config.fenced)
                .with_queue(config.handover_grant, true)
                .with_handover_channel(Arc::new(HandoverChannel::new(config.prefix))),
        );
        let subscriber = Subscriber::new(
            node.clone(),
            config.timeouts,
            config.prefix,
            config.hooks.clone(),
            Arc::new(Channels::lingering(1, SUBSCRIPTION_LINGER)),
        );
        if let Some(target) = sentinel {
            // Waiters listen on the new primary once the sentinels switch.
            let subscriber = Arc::downgrade(&subscriber);
            target.on_switch(move || {
                if let Some(subscriber) = subscriber.upgrade() {
                    subscriber.disconnect();
                }
            });
        }
        Ok(RedisEngine {
            subscriber,
            acquires: GroupCommit::new(Arc::new(AcquireBatch {
                node: node.clone(),
                marker_ttl: config.marker_ttl,
            })),
            releases: GroupCommit::new(Arc::new(ReleaseBatch {
                node: node.clone(),
                marker_ttl: config.marker_ttl,
                hooks: config.hooks.clone(),
            })),
            node,
            prefix: config.prefix.to_owned(),
            marker_ttl: config.marker_ttl,
            hooks: config.hooks.clone(),
            publish_refused: AtomicBool::new(false),
        })
    }

    fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.prefix, key)
    }

    /// How long the waiters a release notifies have the lock first.
    fn reservation_window(&self) -> Duration {
        super::node::reservation_window(&self.hooks)
    }
}

impl Engine for RedisEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(async move {
            // The shared kinds' calls are boxed apart: inline, their kilobyte-sized futures would
            // make every exclusive call's future as large, and it is copied whole into its box.
            if kind.is_shared() {
                let lock = lock_name(&self.prefix, key);
                return Box::pin(self.node.acquire_shared(&lock, owner, ttl, asker, kind)).await;
            }
            let call = LockCall {
                lock: lock_name(&self.prefix, key),
                owner: owner.clone(),
                ttl,
                asker,
                ticket: None,
            };
            self.acquires.submit(call).await?
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
            let lock = lock_name(&self.prefix, key);
            let reply = if kind.is_shared() {
                let window = self.reservation_window();
                Box::pin(
                    self.node
                        .release_shared(&lock, owner, self.marker_ttl, window),
                )
                .await?
            } else {
                let call = ReleaseCall {
                    granted,
                    ..ReleaseCall::plain(lock.clone(), owner.clone())
                };
                self.releases.submit(call).await?
            };
            Ok(settle_release(
                reply,
                &self.publish_refused,
                &self.prefix,
                &lock,
            ))
        })
    }

    fn transfers(&self) -> bool {
        self.node.grants_in_release()
    }

    fn handovers_need_asking(&self) -> bool {
        self.node.handovers_need_asking()
    }

    fn transfer<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        successor: &'a Successor,
    ) -> BoxFuture<'a, EngineResult<Transfer>> {
        Box::pin(async move {
            let lock = lock_name(&self.prefix, key);
            let call = ReleaseCall {
                successor: self.transfers().then(|| successor.clone()),
                ..ReleaseCall::plain(lock.clone(), owner.clone())
            };
            let reply = self.releases.submit(call).await?;
            Ok(settle_transfer(
                reply,
                &self.publish_refused,
                &self.prefix,
                &lock,
            ))
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        Box::pin(async move {
            let locks: Vec<String> = batch
                .iter()
                .map(|item| lock_name(&self.prefix, item.key))
                .collect();
            self.node.renew(&locks, batch).await
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(async move { self.node.inspect(&self.names(key)).await })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        Box::pin(async move {
            let channel = self.names(key).channel;
            let watch = self.subscriber.register(&channel);
            // Still subscribed since an earlier wait (the channel lingers), on a live link.
            if !watch.is_confirmed() {
                self.subscriber.subscribe_and_confirm(&channel).await?;
            }
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
        Box::pin(self.node.scan(pattern))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(async move {
            self.node
                .force_unlock(&self.names(key), self.marker_ttl)
                .await
        })
    }

    fn follow<'a>(
        &'a self,
        key: &'a str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(keyspace::follow(
            self.node.client_source(),
            self.names(key).lock,
            notifications,
            self.node.timeouts(),
            false,
            events,
        ))
    }
}

/// What this engine shows the test suite (`SharedHooks::show`).
#[cfg(distlock_test_hooks)]
impl RedisEngine {
    pub(crate) fn watched_channels(&self) -> u64 {
        self.subscriber.watched() as u64
    }

    pub(crate) fn batched_calls(&self) -> u64 {
        self.acquires.queued() + self.releases.queued()
    }

    pub(crate) fn batched_subscriptions(&self) -> u64 {
        self.subscriber.batched()
    }

    #[cfg(distlock_test_hooks)]
    pub(crate) fn switches_seen(&self) -> u64 {
        self.node.switches_seen()
    }
}
