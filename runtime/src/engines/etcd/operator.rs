//! What operators ask an etcd backend: who holds a lock, which locks are held, breaking one,
//! following one's events, and whether the cluster is fit for locks.

use super::queue::{holds, key_of, Entry};
use super::EtcdEngine;
use crate::engines::engine::{EngineResult, Holder};
use crate::lock::kind::LockKind;
use crate::operating::doctor::Finding;
use crate::operating::key_events::{KeyEvent, KeyEventSender};
use crate::util::glob::glob_match;
use etcd_client::{EventType, GetOptions, WatchOptions};
use std::collections::BTreeSet;
use std::time::Duration;

impl EtcdEngine {
    /// The queue of `key`, oldest entry first.
    async fn entries(&self, key: &str) -> EngineResult<Vec<Entry>> {
        let queue = self.queue(key);
        let read = self
            .txn(etcd_client::Txn::new().and_then([queue.read()]))
            .await?;
        Ok(queue.last_read(&read))
    }

    /// Who holds a lock whose queue is `entries`: its writer, or its readers or permits
    /// together (the longest-living one's time left, the newest one's token).
    async fn holder(&self, entries: &[Entry]) -> Option<Holder> {
        let holding: Vec<&Entry> = (0..entries.len())
            .filter(|&place| holds(entries, place))
            .map(|place| &entries[place])
            .collect();
        let newest = holding.last()?;
        let mut ttl = Duration::ZERO;
        for entry in &holding {
            ttl = ttl.max(self.time_left(entry.lease).await.unwrap_or(Duration::ZERO));
        }
        let shared = entries[0].kind.is_some_and(LockKind::is_shared);
        let waiting = (entries.len() - holding.len()) as u64;
        Some(Holder {
            owner: match shared {
                true => String::new(),
                false => newest.owner.clone(),
            },
            fencing_token: newest.revision as u64,
            ttl,
            label: Some(newest.label.clone()).filter(|label| !label.is_empty()),
            waited_on: waiting > 0,
            waiting: Some(waiting),
            shared: shared.then_some(holding.len() as u64),
        })
    }

    pub(super) async fn inspect_key(&self, key: &str) -> EngineResult<Option<Holder>> {
        let entries = self.entries(key).await?;
        Ok(self.holder(&entries).await)
    }

    /// Keys under the prefix matching `pattern` that have a queue.
    pub(super) async fn list_keys(&self, pattern: &str) -> EngineResult<Vec<String>> {
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
        let keys: BTreeSet<String> = read
            .kvs()
            .iter()
            .filter_map(|kv| key_of(&self.prefix, std::str::from_utf8(kv.key()).ok()?))
            .filter(|key| glob_match(pattern, key))
            .map(str::to_owned)
            .collect();
        Ok(keys.into_iter().collect())
    }

    /// Removes `key`'s holders (their entries, if they are still the ones read); the next in
    /// the queue hold the lock from then on, with larger tokens.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: some holders may have been removed, each removal whole.
    pub(super) async fn unlock(&self, key: &str) -> EngineResult<Option<Holder>> {
        let entries = self.entries(key).await?;
        let Some(holder) = self.holder(&entries).await else {
            return Ok(None);
        };
        let queue = self.queue(key);
        let mut removed = false;
        for place in (0..entries.len()).filter(|&place| holds(&entries, place)) {
            removed |= self.txn(queue.remove(&entries[place])).await?.succeeded();
        }
        // Released meanwhile: nobody was removed by this call.
        Ok(removed.then_some(holder))
    }

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
            .map_err(super::client::transient)?;
        let created = stream.message().await.map_err(super::client::transient)?;
        if !created.is_some_and(|reply| reply.created()) {
            return Err(super::client::transient("etcd refused the watch"));
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
                check: "leader",
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
