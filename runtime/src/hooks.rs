//! Knobs only tests turn, to make a race or a fallback deterministic. A leaf: it imports nothing
//! of the crate, so every layer that has a race to widen can read it.
//!
//! The knobs exist only with the internal feature `__test-hooks` (the test suite enables it);
//! in every other build the hooks are a zero-sized handle and [`read`] returns the defaults, all
//! off.

use std::time::Duration;

/// The hooks of one backend; all zero (off) unless a test sets them through
/// `distlock::__private::raw`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TestHooks {
    /// A pause between a "busy" reply and the subscription: the window subscribe-before-check
    /// must close.
    pub(crate) subscribe_delay: Duration,
    /// The shortest backoff sleep, so that a missed wake-up shows as a long delay.
    pub(crate) backoff_floor: Duration,
    /// A pause between the server's SUBSCRIBE reply and the local confirmation: the window in
    /// which the notification connection can die unseen by the confirmation.
    pub(crate) confirm_delay: Duration,
    /// How long the waiters a release notifies have the lock first (zero: the default,
    /// `HANDOFF_WINDOW`), so that a test's slow notification still lands inside it.
    pub(crate) handoff_window: Duration,
    /// Sentinel `+switch-master` announcements are received but not acted on, as if none
    /// arrived: a demoted primary's `READONLY` is then what moves the connection.
    pub(crate) ignore_switch_announcements: bool,
}

/// Shared by the backend handle and its engine.
#[cfg(feature = "__test-hooks")]
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedHooks(std::sync::Arc<std::sync::Mutex<TestHooks>>);

/// Shared by the backend handle and its engine: nothing to share without `__test-hooks`.
#[cfg(not(feature = "__test-hooks"))]
#[derive(Debug, Clone, Default)]
pub(crate) struct SharedHooks {
    _nothing: (),
}

/// The current hooks (a copy: hooks are read, never held).
pub(crate) fn read(hooks: &SharedHooks) -> TestHooks {
    #[cfg(feature = "__test-hooks")]
    {
        *hooks.0.lock().unwrap_or_else(|e| e.into_inner())
    }
    #[cfg(not(feature = "__test-hooks"))]
    {
        let _ = hooks;
        TestHooks::default()
    }
}

/// Changes the hooks.
#[cfg(feature = "__test-hooks")]
pub(crate) fn set(hooks: &SharedHooks, change: impl FnOnce(&mut TestHooks)) {
    change(&mut hooks.0.lock().unwrap_or_else(|e| e.into_inner()));
}
