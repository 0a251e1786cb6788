//! Knobs only tests turn, to make a race or a fallback deterministic. A leaf: it imports nothing
//! of the crate, so every layer that has a race to widen can read it.
//!
//! The knobs exist only under `cfg(distlock_test_hooks)`, which runtime/build.rs sets for this
//! repository's debug builds (the test suite's) and no dependent crate can set; in every other
//! build the hooks are a zero-sized handle and [`read`] returns the defaults, all
//! off.

use std::time::Duration;

/// The hooks of one backend; all zero (off) unless a test sets them through
/// `distlock::__private::raw`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TestHooks {
    /// A pause between a "busy" reply and the subscription: the window subscribe-before-check
    /// must close.
    pub(crate) subscribe_delay: Duration,
    /// A pause before an acquire reply is acted on: the window in which a handover's message,
    /// on the notification connection, overtakes the reply that queued the caller.
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) acquire_reply_delay: Duration,
    /// A pause before a local transfer's reply is acted on: the window in which the releasing
    /// call is cancelled, or its successor leaves, after the transfer ran.
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) transfer_reply_delay: Duration,
    /// The reply to a local transfer's first request is treated as lost after the transfer ran.
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) lose_first_transfer_reply: bool,
    /// Acquire replies held back by `acquire_reply_delay` so far (a counter tests wait on).
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) acquire_replies_held: u32,
    /// The next acquire reply that says "queued anew" is treated as lost (the request ran): the
    /// retry then hears "queued, the place kept" (one shot).
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) lose_anew_acquire_reply: bool,
    /// A pause before a handover message (`G…`) on a Redis notification connection is acted on:
    /// a message that comes late, after the waiter asked again.
    #[cfg_attr(not(distlock_test_hooks), allow(dead_code))]
    pub(crate) handover_message_delay: Duration,
    /// The shortest backoff sleep, so that a missed wake-up shows as a long delay.
    pub(crate) backoff_floor: Duration,
    /// A pause between the server's SUBSCRIBE reply and the local confirmation: the window in
    /// which the notification connection can die unseen by the confirmation.
    pub(crate) confirm_delay: Duration,
    /// How long the waiters a release notifies have the lock first (zero: the default,
    /// `RESERVATION_WINDOW`), so that a test's slow notification still lands inside it.
    pub(crate) reservation_window: Duration,
    /// Sentinel `+switch-master` announcements are received but not acted on, as if none
    /// arrived: a demoted primary's `READONLY` is then what moves the connection.
    pub(crate) ignore_switch_announcements: bool,
}

/// Shared by the backend handle and its engine: the knobs, and the counters the engine shows.
#[cfg(distlock_test_hooks)]
#[derive(Clone, Default)]
pub(crate) struct SharedHooks {
    knobs: std::sync::Arc<std::sync::Mutex<TestHooks>>,
    probes: std::sync::Arc<std::sync::Mutex<Vec<(Probe, ProbeFn)>>>,
}

#[cfg(distlock_test_hooks)]
impl std::fmt::Debug for SharedHooks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SharedHooks").field(&read(self)).finish()
    }
}

/// A counter an engine shows the test suite (`__private::raw::watched_channels`, …). Engines
/// register them when they are made ([`SharedHooks::show`]), so that the `Engine` trait is the
/// same in every build.
#[cfg(distlock_test_hooks)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Probe {
    /// Release-notification channels with a local watcher.
    WatchedChannels,
    /// Calls that waited for a batch (group commit) instead of going out on their own.
    BatchedCalls,
    /// SUBSCRIBEs that waited for a batch instead of going out on their own.
    BatchedSubscriptions,
    /// Renewal round trips, where the engine groups renewals itself (Redis Cluster).
    RenewalRoundTrips,
    /// Sentinel `+switch-master` announcements the engine acted on.
    SwitchesSeen,
}

#[cfg(distlock_test_hooks)]
type ProbeFn = Box<dyn Fn() -> u64 + Send + Sync>;

#[cfg(distlock_test_hooks)]
impl SharedHooks {
    /// Shows `probe` as `read` of `engine`, for as long as the engine lives (held weakly: an
    /// engine holds its hooks).
    pub(crate) fn show<E: Send + Sync + 'static>(
        &self,
        probe: Probe,
        engine: &std::sync::Arc<E>,
        read: fn(&E) -> u64,
    ) {
        let engine = std::sync::Arc::downgrade(engine);
        let probes = &mut self.probes.lock().unwrap_or_else(|e| e.into_inner());
        probes.push((
            probe,
            Box::new(move || engine.upgrade().map_or(0, |engine| read(&engine))),
        ));
    }

    /// What the engine shows as `probe`; 0 where it shows nothing.
    pub(crate) fn probe(&self, probe: Probe) -> u64 {
        let probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        probes
            .iter()
            .filter(|(shown, _)| *shown == probe)
            .map(|(_, read)| read())
            .sum()
    }

    /// Hooks of their own for another client of the same engine, which shows the same counters.
    pub(crate) fn for_another_client(&self) -> SharedHooks {
        SharedHooks {
            knobs: std::sync::Arc::default(),
            probes: self.probes.clone(),
        }
    }
}

/// Shared by the backend handle and its engine: nothing to share without the test hooks.
#[cfg(not(distlock_test_hooks))]
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedHooks {
    _nothing: (),
}

/// The current hooks (a copy: hooks are read, never held).
pub(crate) fn read(hooks: &SharedHooks) -> TestHooks {
    #[cfg(distlock_test_hooks)]
    {
        *hooks.knobs.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(distlock_test_hooks))]
    {
        let _ = hooks;
        TestHooks::default()
    }
}

/// Changes the hooks.
#[cfg(distlock_test_hooks)]
pub(crate) fn set(hooks: &SharedHooks, change: impl FnOnce(&mut TestHooks)) {
    change(&mut hooks.knobs.lock().unwrap_or_else(|e| e.into_inner()));
}

/// Marks a change of local state that tests wait on — a local queue or turn, a watched channel,
/// a stats counter, a batched call: dropped, it wakes the waits of
/// `__private::raw::until_local` and `wait_local`. Declared first in a function, it signals
/// after the function's locks are released. Does nothing without the test hooks.
pub(crate) struct LocalChange;

impl Drop for LocalChange {
    #[inline]
    fn drop(&mut self) {
        #[cfg(distlock_test_hooks)]
        local_changes::signal();
    }
}

/// Signals a change of local state at once (see [`LocalChange`]).
#[inline]
pub(crate) fn local_changed() {
    drop(LocalChange);
}

/// Waits on [`LocalChange`]s: a version counter for threads, a `Notify` for tasks. Process-wide:
/// another test's changes only wake a wait early, which then checks again.
#[cfg(distlock_test_hooks)]
pub(crate) mod local_changes {
    use std::sync::{Condvar, Mutex, MutexGuard};
    use std::time::{Duration, Instant};

    static VERSION: Mutex<u64> = Mutex::new(0);
    static CHANGED: Condvar = Condvar::new();
    static NOTIFY: tokio::sync::Notify = tokio::sync::Notify::const_new();

    fn version() -> MutexGuard<'static, u64> {
        VERSION.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn signal() {
        *version() += 1;
        CHANGED.notify_all();
        NOTIFY.notify_waiters();
    }

    /// Checks now and after every change, until `check` holds or `limit` passes.
    ///
    /// # Cancel safety
    /// As cancel safe as `check`.
    /// Holds nothing: dropped, it just stops checking.
    pub(crate) async fn until(limit: Duration, mut check: impl AsyncFnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            // Enabled before the check: a change during the check is not missed.
            let mut changed = std::pin::pin!(NOTIFY.notified());
            changed.as_mut().enable();
            if check().await {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return check().await;
            }
        }
    }

    /// [`until`] for a thread outside any runtime: blocks it.
    pub(crate) fn wait(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            // Read before the check: a change during the check is not missed.
            let seen = *version();
            if check() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let guard = version();
            let _ = CHANGED.wait_timeout_while(guard, left, |now| *now == seen);
        }
    }
}
