//! What operators ask of a Redis Cluster: which locks are held (a `SCAN` on every master), and
//! following one lock on the master that owns its slot. Removing a lock needs no routing of its
//! own: its script goes to the slot's owner like any other.

use super::cluster::{parse_cluster_slots, ClusterEngine};
use super::keyspace::{self, ClientSource};
use super::scan;
use super::slot::slot_of;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::lock::key::lock_name;
use crate::operating::key_events::{KeyEventSender, Notifications};
use futures_util::future::join_all;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use std::collections::BTreeSet;

impl ClusterEngine {
    /// The lock keys matching `pattern` on every master (every slot lives on one).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only: dropping the future changes nothing (at most, the slot map it read is kept).
    pub(super) async fn scan_masters(&self, pattern: &str) -> EngineResult<Vec<String>> {
        let masters: BTreeSet<String> = self
            .owners()
            .await?
            .into_iter()
            .map(|(_, _, address)| address)
            .collect();
        let conn = self.node.cluster_connection().await?;
        let pattern = scan::match_pattern(&self.prefix, pattern);
        let scans = masters.iter().map(|address| {
            let conn = conn.clone();
            let pattern = pattern.clone();
            async move {
                let (host, port) = address.rsplit_once(':').unwrap_or((address, "6379"));
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                    host: host.to_owned(),
                    port: port.parse().unwrap_or(6379),
                });
                scan::walk(&pattern, |cmd| {
                    let mut conn = conn.clone();
                    let routing = routing.clone();
                    async move {
                        let reply = conn.route_command(cmd, routing).await?;
                        redis::from_redis_value(reply.extract_error()?).map_err(Into::into)
                    }
                })
                .await
                .map_err(|err| EngineFailure {
                    ambiguous: false,
                    source: format!("SCAN on {address}: {err}").into(),
                })
            }
        });
        let mut keys = BTreeSet::new();
        for found in join_all(scans).await {
            keys.extend(
                found?
                    .iter()
                    .filter_map(|lock| crate::lock::key::key_of(&self.prefix, lock))
                    .map(str::to_owned),
            );
        }
        Ok(keys.into_iter().collect())
    }

    /// Follows the key on the master owning its slot, found again (`CLUSTER SLOTS`) each time
    /// the subscription is restored, so a failover or a migration moves the follower too.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// As `keyspace::follow`: dropped before it resolves, it drops the connection it opened and
    /// leaves no task.
    pub(super) async fn follow_slot_owner(
        &self,
        key: &str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> EngineResult<()> {
        let lock = lock_name(&self.prefix, key);
        let slot = slot_of(&lock);
        let node = self.node.clone();
        let spec = self.spec.clone();
        let source: ClientSource = std::sync::Arc::new(move || {
            let node = node.clone();
            let spec = spec.clone();
            Box::pin(async move {
                let mut conn = node.cluster_connection().await.map_err(|failure| {
                    redis::RedisError::from(std::io::Error::other(failure.source))
                })?;
                let reply = conn
                    .route_command(
                        redis::cmd("CLUSTER").arg("SLOTS").clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
                    )
                    .await?;
                let owner = parse_cluster_slots(reply.extract_error()?)
                    .into_iter()
                    .find(|(start, end, _)| (*start..=*end).contains(&slot))
                    .map(|(_, _, address)| address)
                    .ok_or_else(|| {
                        redis::RedisError::from((
                            redis::ErrorKind::Io,
                            "no node owns the lock's slot now",
                        ))
                    })?;
                spec.node_client(&owner)
            })
        });
        keyspace::follow(source, lock, notifications, self.timeouts, false, events).await
    }
}
