//! Per-backend counters: what happened to locks since start-up.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the wait-time histogram buckets; the last bucket holds everything longer.
pub const WAIT_BUCKETS: [Duration; 8] = [
    Duration::from_micros(100),
    Duration::from_millis(1),
    Duration::from_millis(10),
    Duration::from_millis(100),
    Duration::from_secs(1),
    Duration::from_secs(10),
    Duration::from_secs(60),
    Duration::MAX,
];

#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) acquired: AtomicU64,
    pub(crate) busy: AtomicU64,
    pub(crate) busy_replies: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    pub(crate) transferred: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) renewal_calls: AtomicU64,
    pub(crate) renewed: AtomicU64,
    pub(crate) released: AtomicU64,
    pub(crate) release_found_expired: AtomicU64,
    pub(crate) release_taken_over: AtomicU64,
    pub(crate) lost_ignored: AtomicU64,
    pub(crate) background_releases: AtomicU64,
    pub(crate) left_to_expire: AtomicU64,
    wait: [AtomicU64; 8],
}

impl Stats {
    pub(crate) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Relaxed);
        crate::hooks::local_changed();
    }

    pub(crate) fn record_wait(&self, waited: Duration) {
        let bucket = WAIT_BUCKETS
            .iter()
            .position(|bound| waited <= *bound)
            .unwrap_or(7);
        self.wait[bucket].fetch_add(1, Relaxed);
        crate::hooks::local_changed();
    }

    pub(crate) fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            acquired: self.acquired.load(Relaxed),
            busy: self.busy.load(Relaxed),
            busy_replies: self.busy_replies.load(Relaxed),
            handed_over: self.handed_over.load(Relaxed),
            transferred: self.transferred.load(Relaxed),
            lost: self.lost.load(Relaxed),
            renewal_calls: self.renewal_calls.load(Relaxed),
            renewed: self.renewed.load(Relaxed),
            released: self.released.load(Relaxed),
            release_found_expired: self.release_found_expired.load(Relaxed),
            release_taken_over: self.release_taken_over.load(Relaxed),
            lost_ignored: self.lost_ignored.load(Relaxed),
            background_releases: self.background_releases.load(Relaxed),
            left_to_expire: self.left_to_expire.load(Relaxed),
            wait_histogram: std::array::from_fn(|i| self.wait[i].load(Relaxed)),
        }
    }
}

/// A copy of a backend's counters, from [`Backend::stats`](crate::Backend::stats).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StatsSnapshot {
    /// Locks acquired.
    pub acquired: u64,
    /// Acquisitions that gave up with [`LockError::Busy`](crate::LockError::Busy).
    pub busy: u64,
    /// Acquire attempts the lock server answered with "held by another owner" (the contention
    /// the server saw; local waiters queued behind this process's own contender are not counted).
    pub busy_replies: u64,
    /// Locks acquired by a handover: the previous holder's release granted the lock to this
    /// backend's waiting call directly, in one message, instead of announcing a release it then
    /// asked for (counted in `acquired` too).
    pub handed_over: u64,
    /// Locks acquired by a local transfer: the previous holder, a task of this backend, released
    /// the lock and granted it to this backend's next waiting call in one script, nobody else
    /// waiting for it (counted in `acquired` too).
    pub transferred: u64,
    /// Leases lost while held.
    pub lost: u64,
    /// Renewal script calls (each renews a batch of leases).
    pub renewal_calls: u64,
    /// Leases renewed (summed over batches).
    pub renewed: u64,
    /// Releases that deleted our own lock.
    pub released: u64,
    /// Releases that found the lock already expired.
    pub release_found_expired: u64,
    /// Releases that found the key taken over: another owner holds it (left untouched).
    pub release_taken_over: u64,
    /// Losses that an `on_lost = "ignore"` call ran through.
    pub lost_ignored: u64,
    /// Releases the call could not run itself because it was dropped (cancelled, panicked)
    /// before it could release, or while its release or acquire was in flight: run on a
    /// background task (at once, where the guard is dropped, for the in-process backend).
    pub background_releases: u64,
    /// Locks this process could not release because no runtime was left to run the release
    /// (the runtime was shutting down, or the guard was dropped outside one): they expire by
    /// their TTL. Never counted by the in-process backend, which needs no runtime to release.
    pub left_to_expire: u64,
    /// Acquisitions by time waited, bucketed by [`WAIT_BUCKETS`].
    pub wait_histogram: [u64; 8],
}
