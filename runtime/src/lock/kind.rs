//! Lock kinds: an exclusive (write) lock, a shared read lock, or a semaphore of permits.

use std::time::Duration;

/// How long a waiting writer's intent holds new readers back (`acquire.lua`'s
/// `WRITER_INTENT_MS`; the in-process backend's alike).
pub(crate) const WRITER_INTENT: Duration = Duration::from_millis(500);

/// The longest a waiting writer sleeps between tries, so that its intent is renewed before it
/// lapses even with a `max_backoff` longer than the intent.
pub(crate) const WRITER_RETRY: Duration = Duration::from_millis(400);

/// How a lock is shared between its holders.
///
/// ```
/// use distlock::{Backend, Lock, LockKind};
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// let backend = Backend::in_process();
/// let reader = Lock::new("doc:7").on(&backend).kind(LockKind::Read).acquire().await?;
/// let another = Lock::new("doc:7").on(&backend).kind(LockKind::Read).acquire().await?;
/// let writer = Lock::new("doc:7").on(&backend).acquire().await;
/// assert!(writer.unwrap_err().is_busy(), "readers hold it");
/// # drop((reader, another));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// One holder at a time, excluding readers too: `mode = "write"`, the default.
    Exclusive,
    /// Any number of readers at once, excluding writers: `mode = "read"`. Writer-preferring:
    /// once a writer waits, new readers queue behind it.
    Read,
    /// At most this many holders at once: a semaphore, `permits = N` (at least 1).
    Permits(u32),
}

impl LockKind {
    /// Whether several holders may hold the key at once.
    pub(crate) fn is_shared(self) -> bool {
        !matches!(self, LockKind::Exclusive)
    }
}

/// The words users write for it: `write (exclusive)`, `read`, `semaphore of N permits`.
impl std::fmt::Display for LockKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LockKind::Exclusive => f.write_str("write (exclusive)"),
            LockKind::Read => f.write_str("read"),
            LockKind::Permits(n) => write!(f, "semaphore of {n} permits"),
        }
    }
}
