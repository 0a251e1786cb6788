//! Release notifications for the queue engine: while a task of this process waits for a lock,
//! one watch of the store follows the deletions in the lock's queue. A waiting writer is woken
//! only by the deletion of the entry just ahead of it (its predecessor, which its last request
//! read): when the holder leaves, only the next in line asks, so the lock passes in queue order
//! and a release costs one request, however many processes wait. (Readers and permits, which
//! wait for any of several entries, are woken by every deletion.) The watch remembers the latest
//! deletions, so that the predecessor's deletion coming between the waiter's read and its
//! telling the watch what it waits for wakes it too, and none is missed.
//! The watch is in force before the waiter checks the queue again (the store confirms it), so a
//! release between "busy" and "watching" cannot be missed; it ends when the key's last local
//! waiter leaves.
//!
//! Each watch is its own link (see [`Channels`]): when its stream ends, every waiter of the key
//! is woken to re-check, and the next one that still has to wait watches again.

use super::store::{Deletion, Deletions, Store};
use crate::engines::engine::EngineResult;
use crate::wait::{Channels, OnIdleHook, ReleaseWatch};
use futures_util::StreamExt;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

pub(crate) struct Watches<S: Store> {
    store: Arc<S>,
    channels: Arc<Channels>,
    response: Duration,
    /// The reader task of each watched queue, by its key.
    readers: Mutex<HashMap<String, Reader>>,
    /// What the local waiter of each queue waits for, and the deletions seen lately.
    interest: Arc<Mutex<HashMap<String, Interest>>>,
    me: Weak<Watches<S>>,
}

type Reader = tokio::task::AbortHandle;

/// What wakes a queue's local waiters.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
enum WokenBy {
    /// Nothing yet: the waiter has not asked since it watches, and the request it makes next
    /// reads the queue (deletions meanwhile are remembered, for what it says then).
    #[default]
    Untold,
    /// The deletion of this owner's entry (a writer's predecessor).
    Entry(String),
    /// Any deletion (a reader or a permit waits here: it stays so until the queue is idle).
    Any,
}

impl WokenBy {
    fn by(&self, owner: &str) -> bool {
        match self {
            WokenBy::Untold => false,
            WokenBy::Entry(predecessor) => predecessor == owner,
            WokenBy::Any => true,
        }
    }
}

/// One queue's waiters, as the watch sees them.
#[derive(Default)]
struct Interest {
    woken_by: WokenBy,
    /// The latest deletions the watch delivered, oldest first.
    recent: VecDeque<Deletion>,
    /// The position of the newest deletion dropped from `recent` (0: none).
    forgotten: u64,
}

/// Deletions each queue's watch remembers for a waiter that has not said yet what it waits for.
const REMEMBERED: usize = 32;

impl Interest {
    /// Whether a deletion delivered after revision `read_at` is one this waiter waits for
    /// (or may be: one forgotten since).
    fn missed(&self, read_at: u64) -> bool {
        self.forgotten > read_at
            || self
                .recent
                .iter()
                .any(|deleted| deleted.at > read_at && self.woken_by.by(&deleted.owner))
    }

    /// A waiter read the queue and waits for the deletion of `predecessor`'s entry (`None`:
    /// for any). A queue where a reader or a permit waits stays woken by any deletion.
    fn tell(&mut self, predecessor: Option<String>) {
        self.woken_by = match (&self.woken_by, predecessor) {
            (WokenBy::Any, _) | (_, None) => WokenBy::Any,
            (_, Some(entry)) => WokenBy::Entry(entry),
        };
    }

    /// Remembers a deletion; `true` when the waiter waits for it.
    fn deleted(&mut self, deleted: Deletion) -> bool {
        if self.recent.len() == REMEMBERED {
            if let Some(dropped) = self.recent.pop_front() {
                self.forgotten = self.forgotten.max(dropped.at);
            }
        }
        let wakes = self.woken_by.by(&deleted.owner);
        self.recent.push_back(deleted);
        wakes
    }
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

impl<S: Store> Watches<S> {
    pub(crate) fn new(store: Arc<S>, response: Duration) -> Arc<Watches<S>> {
        Arc::new_cyclic(|me| Watches {
            store,
            channels: Arc::new(Channels::needing(1)),
            response,
            readers: Mutex::new(HashMap::new()),
            interest: Arc::default(),
            me: me.clone(),
        })
    }

    /// Registers for the releases of `key`'s queue; resolves once the store confirmed the
    /// watch (or, after a transient failure, unconfirmed: the waiter's backoff carries it).
    ///
    /// # Cancel safety
    /// Cancel safe: the registration is dropped with the future (the last one out ends the
    /// watch); a watch confirmed meanwhile serves the next waiter of the queue.
    pub(crate) async fn watch(&self, key: &str) -> EngineResult<ReleaseWatch> {
        let me = self.me.clone();
        let on_idle: OnIdleHook = Arc::new(move |channel: String| {
            if let Some(watches) = me.upgrade() {
                watches.stop(&channel);
            }
        });
        let release = self.channels.register(key, Some(on_idle));
        if release.is_confirmed() {
            return Ok(release);
        }
        match tokio::time::timeout(self.response, self.open(key)).await {
            Ok(Ok(())) => {}
            Ok(Err(failure)) if !failure.ambiguous => return Err(failure),
            Ok(Err(failure)) => tracing::debug!(
                target: "distlock::wait",
                queue = key,
                error = %failure.source,
                "release notifications unavailable for now; waiting on backoff until the next watch"
            ),
            Err(_) => tracing::debug!(
                target: "distlock::wait",
                queue = key,
                "the store did not confirm the watch in time; waiting on backoff until the next watch"
            ),
        }
        Ok(release)
    }

    /// The waiter of `key`'s queue read it at `read_at` in the store's order and waits for the
    /// deletion of `predecessor`'s entry (`None`: for any). A deletion delivered since that read
    /// wakes it at once: it may be the one it waits for.
    /// Nothing is recorded for a queue nobody of this process watches yet: its first waiter
    /// asks again once it watches.
    pub(crate) fn wait_behind(&self, key: &str, predecessor: Option<String>, read_at: u64) {
        if !self.channels.is_watched(key) {
            return;
        }
        let missed = {
            let mut interest = self.interest.lock().unwrap_or_else(|e| e.into_inner());
            let interest = interest.entry(key.to_owned()).or_default();
            interest.tell(predecessor);
            interest.missed(read_at)
        };
        if missed {
            self.channels.notify(key);
        }
    }

    /// Opens a watch of `key`'s deletions, waits for the store to confirm it, and leaves a task
    /// reading them.
    async fn open(&self, key: &str) -> EngineResult<()> {
        let deletions = self.store.deletions(key).await?;
        let epoch = self.channels.new_link();
        self.channels.link_up(epoch);
        self.channels.confirm(key, epoch);
        let end = LinkEnd {
            channels: self.channels.clone(),
            epoch,
        };
        let reader = Delivery {
            channels: self.channels.clone(),
            interest: self.interest.clone(),
            channel: key.to_owned(),
        };
        let task = tokio::spawn(read(deletions, reader, end)).abort_handle();
        let replaced = self
            .readers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.to_owned(), task);
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
    #[cfg(distlock_test_hooks)]
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
    /// An entry was deleted: wakes the waiter if it waits for that.
    fn deleted(&self, deleted: Deletion) {
        let wakes = {
            let mut interest = self.interest.lock().unwrap_or_else(|e| e.into_inner());
            let interest = interest.entry(self.channel.clone()).or_default();
            interest.deleted(deleted)
        };
        if wakes {
            self.channels.notify(&self.channel);
        }
    }
}

/// Delivers a watch's deletions until its stream ends; then the link is lost.
async fn read(mut deletions: Deletions, delivery: Delivery, end: LinkEnd) {
    let _end = end;
    while let Some(deleted) = deletions.next().await {
        delivery.deleted(deleted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone(owner: &str, at: u64) -> Deletion {
        Deletion {
            owner: owner.into(),
            at,
        }
    }

    #[test]
    fn a_waiter_is_woken_by_its_predecessor_even_when_told_late() {
        let mut interest = Interest::default();
        // Deletions delivered before the waiter said what it waits for wake nobody: its next
        // request reads the queue.
        assert!(!interest.deleted(gone("a", 10)));
        interest.deleted(gone("b", 12));
        interest.tell(Some("b".into()));
        assert!(interest.missed(11), "b was deleted after the waiter's read");
        assert!(!interest.missed(12), "b's deletion was in the read already");
        interest.tell(Some("c".into()));
        assert!(!interest.missed(5), "only others were deleted");
        assert!(!interest.deleted(gone("d", 13)));
        assert!(interest.deleted(gone("c", 14)));
        for at in 20..20 + REMEMBERED as u64 {
            interest.deleted(gone("x", at));
        }
        assert!(
            interest.missed(13),
            "a forgotten deletion may have been the one"
        );
        assert!(!interest.missed(20 + REMEMBERED as u64));
    }

    #[test]
    fn a_reader_waiting_makes_every_deletion_wake() {
        let mut interest = Interest::default();
        interest.tell(Some("a".into()));
        interest.tell(None);
        interest.tell(Some("b".into()));
        assert!(interest.deleted(gone("z", 1)), "a reader still waits here");
    }
}
