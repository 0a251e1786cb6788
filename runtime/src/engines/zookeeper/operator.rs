//! What operators ask of ZooKeeper alone: following a lock's events, and whether the ensemble
//! and the session are fit for locks (the queue engine answers who holds what).

use super::store::{lease_limit, ZkStore};
use crate::engines::engine::EngineResult;
use crate::operating::doctor::{Check, Finding};
use crate::operating::key_events::{KeyEvent, KeyEventSender};
use zookeeper_client as zk;

impl ZkStore {
    /// Follows `key`'s queue: every entry made (a contender joining) and deleted (a release, a
    /// lapsed lease or session, a waiter leaving), as `create` and `delete`.
    ///
    /// # Cancel safety
    /// Cancel safe: a watch set for a dropped call ends with its watcher; once it returned, the
    /// follower runs until nobody listens.
    pub(super) async fn follow_key(&self, key: &str, events: KeyEventSender) -> EngineResult<()> {
        let queue = self.paths.queue(key);
        let client = self.connection.client().await?;
        let mut watcher = self
            .connection
            .within(client.watch(&queue, zk::AddWatchMode::PersistentRecursive))
            .await?;
        let server = self.connection.spec().describe();
        tokio::spawn(async move {
            let queue = queue;
            loop {
                let event = tokio::select! {
                    () = events.closed() => return,
                    event = watcher.changed() => event,
                };
                // The queue's own node (made before its first entry) is not an entry.
                if event.path == queue {
                    continue;
                }
                let event = match event.event_type {
                    zk::EventType::NodeCreated => "create",
                    zk::EventType::NodeDeleted => "delete",
                    zk::EventType::Session => {
                        let reason = format!("the ZooKeeper session is {}", event.session_state);
                        if event.session_state.is_terminated() {
                            events.send(KeyEvent::Interrupted { server, reason });
                            return;
                        }
                        continue;
                    }
                    // A renewal changes nothing; a child's change comes as its own event.
                    _ => continue,
                };
                let told = events.send(KeyEvent::Notified {
                    server: server.clone(),
                    event: event.to_owned(),
                });
                if !told {
                    return;
                }
            }
        });
        Ok(())
    }

    /// Whether the ensemble can keep locks (the server answering is in its quorum) and the
    /// session covers the watchdog's lease.
    pub(super) async fn diagnose(&self) -> EngineResult<Vec<Finding>> {
        let client = self.connection.client().await?;
        // Through the leader: a server cut off from its quorum does not answer a sync.
        self.connection.within(client.sync("/")).await?;
        let mut findings = Vec::new();
        let granted = client.session_timeout();
        if lease_limit(granted) < self.watchdog_lease {
            findings.push(Finding {
                check: Check::Session,
                advice: format!(
                    "the ensemble granted a {} session, which covers leases of up to {}: \
                     watchdog locks (lease {}) are refused; ask for a session of at least {} \
                     with `?session_timeout=` in the URL (within the ensemble's \
                     maxSessionTimeout), or shorten watchdog_lease",
                    humantime::format_duration(granted),
                    humantime::format_duration(lease_limit(granted)),
                    humantime::format_duration(self.watchdog_lease),
                    humantime::format_duration(self.watchdog_lease * 4 / 3),
                ),
            });
        }
        Ok(findings)
    }
}
