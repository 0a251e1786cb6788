//! Release notifications from etcd: while a task of this process waits for a lock, one etcd
//! watch follows the deletions in the lock's queue. A waiting writer is woken only by the
//! deletion of the entry just ahead of it (its predecessor, which its last request read): when
//! the holder leaves, only the next in line asks, so the lock passes in queue order and a
//! release costs one request, however many processes wait. (Readers and permits, which wait
//! for any of several entries, are woken by every deletion.) A deletion that came between the
//! waiter's read and its telling the watch what it waits for wakes it too, so none is missed.
//! The watch is created before the waiter checks the queue again and is confirmed by etcd's
//! `created` reply, so a release between "busy" and "watching" cannot be missed; it is
//! cancelled when the key's last local waiter leaves.
//!
//! Each watch is its own link (see [`Channels`]): when its stream breaks, every waiter of the
//! key is woken to re-check, and the next one that still has to wait watches again.

use super::client::Connection;
use crate::engine::EngineResult;
use crate::wait::{Channels, OnIdleHook, ReleaseWatch};
use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchStream};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub(crate) struct Watches {
    connection: Arc<Connection>,
    channels: Arc<Channels>,
    response: Duration,
    /// The reader task of each watched queue, by its channel (the queue's start).
    readers: Mutex<HashMap<String, Reader>>,
    /// What the local waiter of each queue waits for, and the deletions seen lately.
    interest: Arc<Mutex<HashMap<String, Interest>>>,
    me: Weak<Watches>,
}

type Reader = tokio::task::AbortHandle;

/// One queue's waiter, as the watch sees it.
#[derive(Default)]
struct Interest {
    /// The entry whose deletion wakes the waiter (`None`: every deletion does).
    predecessor: Option<String>,
    /// The revision of the latest deletion the watch delivered.
    deleted_at: i64,
}

/// The reader's end, however it ends: the link is lost, so the key's waiters re-check.
struct LinkEnd {
    channels: Arc<Channels>,
    epoch: u64,
}

impl Drop for LinkEnd {
    fn drop(&mut self) {
        self.channels.link_lost(self.epoch);
    }
}

impl Watches {
    pub(crate) fn new(connection: Arc<Connection>, response: Duration) -> Arc<Watches> {
        Arc::new_cyclic(|me| Watches {
            connection,
            channels: Arc::new(Channels::needing(1)),
            response,
            readers: Mutex::new(HashMap::new()),
            interest: Arc::default(),
            me: me.clone(),
        })
    }

    /// Registers for the releases of the queue starting at `start`; resolves once etcd
    /// confirmed the watch (or, after a transient failure, unconfirmed: the waiter's backoff
    /// carries it).
    pub(crate) async fn watch(&self, start: &str) -> EngineResult<ReleaseWatch> {
        let me = self.me.clone();
        let on_idle: OnIdleHook = Arc::new(move |channel: String| {
            if let Some(watches) = me.upgrade() {
                watches.stop(&channel);
            }
        });
        let release = self.channels.register(start, Some(on_idle));
        if release.is_confirmed() {
            return Ok(release);
        }
        match tokio::time::timeout(self.response, self.open(start)).await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) if !failure.ambiguous => return Err(failure),
            Ok(Err(failure)) => tracing::debug!(
                target: "distlock::wait",
                queue = start,
                error = %failure.source,
                "release notifications unavailable for now; waiting on backoff until the next watch"
            ),
            Err(_) => tracing::debug!(
                target: "distlock::wait",
                queue = start,
                "etcd did not confirm the watch in time; waiting on backoff until the next watch"
            ),
        }
        Ok(release)
    }

    /// The waiter of queue `start` read the queue at revision `read_at` and waits for
    /// `predecessor`'s deletion (`None`: for any). A deletion delivered since that read wakes
    /// it at once: it may be the one it waits for.
    /// Nothing is recorded for a queue nobody of this process watches yet: its first waiter
    /// asks again once it watches.
    pub(crate) fn wait_behind(&self, start: &str, predecessor: Option<String>, read_at: i64) {
        if !self.channels.is_watched(start) {
            return;
        }
        let missed = {
            let mut interest = self.interest.lock().unwrap_or_else(|e| e.into_inner());
            let interest = interest.entry(start.to_owned()).or_default();
            interest.predecessor = predecessor;
            interest.deleted_at > read_at
        };
        if missed {
            self.channels.notify(start);
        }
    }

    /// Opens a watch of `start`'s deletions, waits for etcd to confirm it, and leaves a task
    /// reading its events.
    async fn open(&self, start: &str) -> EngineResult<()> {
        let client = self.connection.client().await?;
        let options = WatchOptions::new()
            .with_prefix()
            .with_filters([WatchFilterType::NoPut]);
        let mut stream = client
            .watch_client()
            .watch(start, Some(options))
            .await
            .map_err(super::client::transient)?;
        let created = stream.message().await.map_err(super::client::transient)?;
        if !created.is_some_and(|reply| reply.created() && !reply.canceled()) {
            return Err(super::client::transient("etcd refused the watch"));
        }
        let epoch = self.channels.new_link();
        self.channels.link_up(epoch);
        self.channels.confirm(start, epoch);
        let end = LinkEnd {
            channels: self.channels.clone(),
            epoch,
        };
        let reader = Delivery {
            channels: self.channels.clone(),
            interest: self.interest.clone(),
            channel: start.to_owned(),
        };
        let task = tokio::spawn(read(stream, reader, end)).abort_handle();
        let replaced = self
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(start.to_owned(), task);
        if let Some(old) = replaced {
            old.abort();
        }
        Ok(())
    }

    /// The last local waiter of `channel` left: its watch ends.
    fn stop(&self, channel: &str) {
        let reader = self
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(channel);
        if let Some(reader) = reader {
            reader.abort();
        }
        let mut interest = self.interest.lock().unwrap_or_else(|e| e.into_inner());
        interest.remove(channel);
    }

    /// Ends every watch (the backend shut down).
    pub(crate) fn close(&self) {
        let readers = std::mem::take(&mut *self.readers.lock().unwrap_or_else(|e| e.into_inner()));
        for reader in readers.into_values() {
            reader.abort();
        }
    }

    /// Queues with at least one local waiter.
    #[cfg(feature = "__test-hooks")]
    pub(crate) fn watched(&self) -> usize {
        self.channels.watched()
    }
}

/// Where a reader delivers its queue's deletions.
struct Delivery {
    channels: Arc<Channels>,
    interest: Arc<Mutex<HashMap<String, Interest>>>,
    channel: String,
}

impl Delivery {
    /// `key` was deleted at `revision`: wakes the waiter if it waits for that.
    fn deleted(&self, key: &[u8], revision: i64) {
        let wakes = {
            let mut interest = self.interest.lock().unwrap_or_else(|e| e.into_inner());
            let interest = interest.entry(self.channel.clone()).or_default();
            interest.deleted_at = interest.deleted_at.max(revision);
            interest
                .predecessor
                .as_ref()
                .is_none_or(|predecessor| predecessor.as_bytes() == key)
        };
        if wakes {
            self.channels.notify(&self.channel);
        }
    }
}

/// Reads a watch's events until its stream ends: each deletion in the queue is delivered.
async fn read(mut stream: WatchStream, delivery: Delivery, end: LinkEnd) {
    let _end = end;
    while let Ok(Some(reply)) = stream.message().await {
        if reply.canceled() {
            return;
        }
        for event in reply.events() {
            if let (EventType::Delete, Some(kv)) = (event.event_type(), event.kv()) {
                delivery.deleted(kv.key(), kv.mod_revision());
            }
        }
    }
}
