//! What operators ask of etcd alone: following a lock's events, and whether the cluster is fit
//! for locks (the queue engine answers who holds what).

use super::store::EtcdStore;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::operating::doctor::{Check, Finding};
use crate::operating::key_events::{KeyEvent, KeyEventSender};
use etcd_client::{EventType, WatchOptions};

impl EtcdStore {
    /// Follows `key`'s queue: every write (a grant, a renewal, a waiter joining) and every
    /// deletion (a release, a lapsed lease, a waiter leaving), as `put` and `delete`.
    ///
    /// # Cancel safety
    /// Cancel safe: a watch opened for a dropped call is dropped with it; once it returned, the
    /// follower runs until nobody listens.
    pub(super) async fn follow_key(&self, key: &str, events: KeyEventSender) -> EngineResult<()> {
        let start = self.queue(key).start;
        let client = self.connection.client().await?;
        let mut stream = client
            .watch_client()
            .watch(start.as_str(), Some(WatchOptions::new().with_prefix()))
            .await
            .map_err(EngineFailure::ambiguous)?;
        let created = stream.message().await.map_err(EngineFailure::ambiguous)?;
        if !created.is_some_and(|reply| reply.created()) {
            return Err(EngineFailure::ambiguous("etcd refused the watch"));
        }
        let server = self.connection.spec().describe();
        tokio::spawn(async move {
            loop {
                let reply = tokio::select! {
                    () = events.closed() => return,
                    reply = stream.message() => reply,
                };
                let reason = match reply {
                    Ok(Some(reply)) if !reply.canceled() => {
                        if forward(&events, &server, reply.events()) {
                            continue;
                        }
                        return;
                    }
                    Ok(_) => "etcd ended the watch".to_owned(),
                    Err(err) => err.to_string(),
                };
                events.send(KeyEvent::Interrupted { server, reason });
                return;
            }
        });
        Ok(())
    }

    /// Whether the cluster can keep locks: a leader, and a quorum of the members the client
    /// knows answering.
    pub(super) async fn diagnose(&self) -> EngineResult<Vec<Finding>> {
        let status = self
            .connection
            .call(|mut client| async move { client.status().await })
            .await?;
        let mut findings = Vec::new();
        if status.leader() == 0 {
            findings.push(Finding {
                check: Check::Leader,
                advice: "the etcd member answering has no leader: no lock can be taken or \
                         released until a majority of members can elect one"
                    .into(),
            });
        }
        Ok(findings)
    }
}

/// Sends `events` on; `false` once nobody listens.
fn forward(sender: &KeyEventSender, server: &str, events: &[etcd_client::Event]) -> bool {
    events.iter().all(|event| {
        let event = match event.event_type() {
            EventType::Put => "put",
            EventType::Delete => "delete",
        };
        sender.send(KeyEvent::Notified {
            server: server.to_owned(),
            event: event.to_owned(),
        })
    })
}
