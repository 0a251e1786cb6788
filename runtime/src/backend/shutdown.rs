//! [`Backend::shutdown`] and [`Registry::shutdown_all`]: a process that stops leaves no lock
//! held for a TTL.

use super::handle::Backend;
use crate::backend::registry::Registry;
use crate::error::Operation;
use crate::error::{LockError, LostReason};
use crate::lock::release::release_at_shutdown;
use futures_util::future::join_all;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How long [`Backend::shutdown`] waits for the releases, even with a dead server.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(2);

impl Backend {
    /// Stops the backend for a process that is stopping, so that its locks are free at once
    /// instead of after their TTL (30 s with the watchdog):
    /// 1. no new locks: acquires, waiting ones included, fail with [`LockError::ShutDown`];
    /// 2. every lease held is marked lost ([`LostReason::ShutDown`]): running bodies see it at
    ///    their next checkpoint, `lost()` resolves, `on_lost = "abort"` drops them;
    /// 3. every lease is released on the server, all at once (concurrent releases share round
    ///    trips: one per server and batch), renewal stops, and the release-notification
    ///    connections close;
    /// 4. it returns within [`SHUTDOWN_TIMEOUT`] (2 s) whatever the servers do.
    ///
    /// Guards still held by the application release nothing more when they are dropped or
    /// released (their `release()` answers `Released`). Idempotent: a second call finds nothing to
    /// release.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let backend = distlock::Backend::in_process();
    /// let guard = distlock::Lock::new("job:1").on(&backend).acquire().await.unwrap();
    /// backend.shutdown().await.unwrap();
    /// assert!(!guard.is_held());
    /// assert!(backend.inspect("job:1").await.unwrap().is_none());
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when some releases were not confirmed within the bound (a server
    /// down or unreachable): those keys expire by their TTL, and the error says how many. It is
    /// [ambiguous](crate::BackendError::is_ambiguous): a release without an answer may have run.
    ///
    /// # Panics
    /// Panics when polled outside a Tokio runtime, or on one built without its time driver:
    /// the bound is a Tokio timer.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after its first poll, it leaves the backend closed to new locks
    /// and its leases marked lost, and the releases not yet confirmed are not finished (they may
    /// or may not have run); those keys expire by their TTL. A second call does not retry them:
    /// the leases are no longer the backend's.
    pub async fn shutdown(&self) -> Result<(), LockError> {
        self.inner.closing.store(true, Ordering::Release);
        let leases = self.inner.watchdog.take_all();
        for lease in &leases {
            lease.mark_lost(LostReason::ShutDown);
        }
        let started = Instant::now();
        let releases = join_all(leases.iter().map(|lease| release_at_shutdown(self, lease)));
        let ended = async {
            let released = releases.await;
            // Then the notification links: nobody of this backend waits any more.
            self.inner.engine.close_links().await;
            released
        };
        let released = match tokio::time::timeout(SHUTDOWN_TIMEOUT, ended).await {
            Ok(answers) => answers.into_iter().filter(|released| *released).count(),
            Err(_) => 0,
        };
        let left = leases.len() - released;
        tracing::info!(
            target: "distlock::shutdown",
            backend = %self.name(),
            released,
            left_to_expire = left,
            took_us = started.elapsed().as_micros() as u64,
            "backend shut down"
        );
        if left == 0 {
            return Ok(());
        }
        self.inner
            .stats
            .left_to_expire
            .fetch_add(left as u64, Ordering::Relaxed);
        Err(self.failure(
            Operation::Shutdown,
            true,
            format!(
                "{left} of {} locks were not released within {SHUTDOWN_TIMEOUT:?}; they expire \
                 by their TTL",
                leases.len()
            ),
        ))
    }
}

impl Registry {
    /// [`Backend::shutdown`] for every backend registered (and `"default"`, if it was built from
    /// the environment), all at once: call it when the process is asked to stop, after the
    /// server stops taking requests.
    ///
    /// # Errors
    /// [`LockError::Backend`] when a backend's releases were not all confirmed within
    /// [`SHUTDOWN_TIMEOUT`]: one such backend's error, returned after every backend was shut
    /// down.
    ///
    /// # Panics
    /// As [`Backend::shutdown`], when a backend is registered.
    ///
    /// # Cancel safety
    /// Not cancel safe, as [`Backend::shutdown`] for each backend: dropped after its first poll,
    /// every backend is closed and the releases not yet confirmed are left to expire by their
    /// TTL.
    pub async fn shutdown_all(&self) -> Result<(), LockError> {
        let backends = self.backends();
        let outcomes = join_all(backends.iter().map(Backend::shutdown)).await;
        outcomes.into_iter().collect()
    }
}
