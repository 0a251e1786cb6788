//! How a lock waits, how long its lease lives, and what happens when the lease is lost.

use std::time::Duration;

/// How long to wait for a busy lock before [`LockError::Busy`](crate::LockError::Busy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// Wait at most this long in total (`Duration::ZERO`: try once).
    For(Duration),
    /// Wait until acquired.
    Forever,
}

/// How the lease on the server lives while the call runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lease {
    /// A short TTL (the backend's watchdog lease, 30 s by default) renewed every third of it by
    /// the backend's watchdog while the call runs. A crashed holder frees the lock within one TTL.
    Watchdog,
    /// A fixed lease of this length, never renewed: the call must finish within it. At least 100 ms.
    Fixed(Duration),
}

/// What happens to the locked call when its lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnLost {
    /// The call is stopped at its next check: between top-level statements of an annotated
    /// function, or at an explicit [`checkpoint()`](crate::checkpoint). No next step runs on a
    /// lost lock.
    Checkpoint,
    /// The call's future is dropped at its next `.await` once the loss is detected, and the call
    /// returns [`LockError::Lost`](crate::LockError::Lost).
    Abort,
    /// The call runs to completion (availability over consistency); the loss is logged and
    /// counted in [`StatsSnapshot::lost_ignored`](crate::StatsSnapshot::lost_ignored).
    Ignore,
}

/// Consecutive failed round trips (errors, not "busy") after which an acquire or a release gives
/// up.
pub(crate) const MAX_FAILED_ATTEMPTS: u32 = 3;

/// The grant time: how long a queued waiter's place lasts without it asking again (`queue.lua`),
/// and how long a lock handed over to it (`release.lua`) is held on the server before it
/// confirms it. A queued waiter asks every third of it, and a waiting one at least every
/// `max_backoff`, so three asks keep a place (and leave two thirds of the grant when the
/// handover comes); never below 300 ms. A waiter that died while queued holds the place (or the
/// handed-over lock) this long.
pub(crate) fn handover_grant(max_backoff: Duration) -> Duration {
    (max_backoff * 3).max(Duration::from_millis(300))
}

/// How long a lease granted (or renewed) for `ttl` may be trusted after its request was sent:
/// the TTL less the drift margin — clock-rate differences between this process and the
/// server(s) (`drift_factor` of the TTL, 1% by default) plus 2 ms of scheduling slack, as in
/// Redlock.
pub(crate) fn valid_for(ttl: Duration, drift_factor: f64) -> Duration {
    ttl.saturating_sub(ttl.mul_f64(drift_factor) + Duration::from_millis(2))
}
