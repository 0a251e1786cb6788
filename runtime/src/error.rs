//! [`LockError`]: everything a lock can report, each variant saying what happened and what to do.

use crate::lock::kind::LockKind;
use std::fmt;
use std::time::Duration;

/// Why a held lease stopped being ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LostReason {
    /// The local validity window ran out without a confirmed renewal (a paused process, a slow or
    /// unreachable server, or a fixed lease that outlived its duration).
    Expired,
    /// A renewal found the key gone: it expired on the server or was deleted.
    Gone,
    /// A renewal found the key held by another owner: it was taken over (force-unlocked, or it
    /// expired and someone else acquired it).
    TakenOver,
    /// `max_hold` elapsed: the watchdog stopped renewing so a stuck call cannot hold the lock forever.
    MaxHoldExceeded,
    /// The backend shut down ([`Backend::shutdown`](crate::Backend::shutdown)): it released the
    /// lock so that the next holder need not wait out its TTL.
    ShutDown,
}

impl LostReason {
    /// The `reason` label of `distlock_leases_lost_total`: the variant in snake case.
    pub(crate) const fn label(self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::Gone => "gone",
            LostReason::TakenOver => "taken_over",
            LostReason::MaxHoldExceeded => "max_hold_exceeded",
            LostReason::ShutDown => "shut_down",
        }
    }
}

impl fmt::Display for LostReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LostReason::Expired => {
                "its lease ran out (a fixed lease ended, or no renewal was confirmed in time)"
            }
            LostReason::Gone => "the key expired or was deleted on the server",
            LostReason::TakenOver => "another owner holds the key now",
            LostReason::MaxHoldExceeded => "the call ran past max_hold, so renewal stopped",
            LostReason::ShutDown => "the backend shut down and released it",
        })
    }
}

/// A failure of the lock server that is not a lock outcome: connection refused, timeout, script error.
///
/// [`is_ambiguous`](BackendError::is_ambiguous) tells whether the command may have run on the server
/// although no reply arrived (a timeout or a connection dropped mid-request).
#[derive(Debug)]
pub struct BackendError {
    pub(crate) backend: String,
    pub(crate) operation: Operation,
    pub(crate) ambiguous: bool,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

impl BackendError {
    pub(crate) fn new(
        backend: &str,
        operation: Operation,
        ambiguous: bool,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Self {
        BackendError {
            backend: backend.to_owned(),
            operation,
            ambiguous,
            source: source.into(),
        }
    }

    /// The backend that failed: its registry name, or for a backend used only through
    /// [`Lock::on`](crate::Lock::on), where it is (its URL without passwords).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// What was being done.
    pub fn operation(&self) -> Operation {
        self.operation
    }

    /// `true` when the command may have been executed although no reply was read.
    pub fn is_ambiguous(&self) -> bool {
        self.ambiguous
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "backend `{}` failed during {}: {}",
            self.backend, self.operation, self.source
        )?;
        if self.ambiguous {
            f.write_str(" (the outcome is unknown: no reply arrived)")?;
        }
        Ok(())
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// What a backend was doing when it failed ([`BackendError::operation`]); its
/// [`Display`](fmt::Display) is the word the error's message uses.
///
/// ```
/// use distlock::Operation;
///
/// assert_eq!(Operation::FencedWrite.to_string(), "fenced write");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Operation {
    /// Taking a lock.
    Acquire,
    /// Subscribing to a lock's release notifications while waiting for it.
    Subscribe,
    /// Releasing a lock.
    Release,
    /// Renewing a lease (the watchdog's failed renewals end as a lost lease instead).
    Renew,
    /// [`LockGuard::extend`](crate::LockGuard::extend).
    Extend,
    /// [`Backend::ping`](crate::Backend::ping) (and [`BackendBuilder::connect`](crate::BackendBuilder::connect)).
    Ping,
    /// [`Backend::shutdown`](crate::Backend::shutdown).
    Shutdown,
    /// [`Backend::inspect`](crate::Backend::inspect).
    Inspect,
    /// [`Backend::list`](crate::Backend::list).
    List,
    /// [`Backend::force_unlock`](crate::Backend::force_unlock).
    Unlock,
    /// [`Backend::events`](crate::Backend::events).
    Events,
    /// [`Backend::doctor`](crate::Backend::doctor).
    Doctor,
    /// [`FencedStore::write`](crate::redis::FencedStore::write).
    FencedWrite,
}

impl Operation {
    /// The word for it: `acquire`, `subscribe`, `release`, `renew`, `extend`, `ping`,
    /// `shutdown`, `inspect`, `list`, `unlock`, `events`, `doctor` or `fenced write`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Operation::Acquire => "acquire",
            Operation::Subscribe => "subscribe",
            Operation::Release => "release",
            Operation::Renew => "renew",
            Operation::Extend => "extend",
            Operation::Ping => "ping",
            Operation::Shutdown => "shutdown",
            Operation::Inspect => "inspect",
            Operation::List => "list",
            Operation::Unlock => "unlock",
            Operation::Events => "events",
            Operation::Doctor => "doctor",
            Operation::FencedWrite => "fenced write",
        }
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a lock operation can report.
///
/// Annotated functions return these through their own error type (`E: From<LockError>`).
///
/// ```
/// use distlock::LockError;
/// use std::time::Duration;
///
/// let busy = LockError::Busy {
///     key: "order:7".into(),
///     waited: Duration::from_millis(250),
///     retry_after: Some(Duration::from_millis(1200)),
/// };
/// assert_eq!(
///     busy.to_string(),
///     "lock `order:7` is held by someone else (waited 250ms; the holder's lease ends in 1s 200ms); \
///      retry after that or allow a longer `wait`"
/// );
/// assert_eq!(busy.retry_after(), Some(Duration::from_millis(1200)));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another owner held the lock for the whole wait budget.
    #[error("{}", BusyMessage { key, waited: *waited, retry_after: *retry_after })]
    Busy {
        /// The rendered key.
        key: String,
        /// How long this call waited before giving up: zero for a single try (no `wait`).
        waited: Duration,
        /// When the lock may be free: the holder's remaining lease (or the time the lock is
        /// left to waiters a release notified) as the server reported it at the call's last
        /// try. A watchdog holder renews its lease, so it may hold on past this; it is still
        /// the best time to try again. `None` when no server answered about the holder (the
        /// call waited for another task of this process and never asked).
        retry_after: Option<Duration>,
    },
    /// The lease was lost while the call ran; no further step may assume exclusivity.
    #[error("lock `{key}` was lost: {reason}; the work done so far is not protected, retry the operation")]
    Lost {
        /// The rendered key.
        key: String,
        /// Why the lease ended.
        reason: LostReason,
    },
    /// The named backend was never registered and could not be built from the environment.
    #[error("lock backend `{backend}` is not configured; {hint}")]
    NotConfigured {
        /// The registry name.
        backend: String,
        /// What to do about it.
        hint: String,
    },
    /// A setting (environment variable, URL, builder value) is invalid.
    #[error("invalid lock configuration: {setting} {problem}")]
    InvalidConfig {
        /// The variable or setting, e.g. `DISTLOCK_URL`.
        setting: String,
        /// What is wrong with it and what is accepted (passwords redacted).
        problem: String,
    },
    /// The key cannot be used: too long, or containing characters that would change its structure.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// What is wrong with the key and how to fix it.
        reason: String,
    },
    /// The primary granted the lock, but fewer replicas than
    /// [`min_replicas`](crate::BackendBuilder::min_replicas) acknowledged it within
    /// [`replica_timeout`](crate::BackendBuilder::replica_timeout). The lock was released again:
    /// a failover now could promote a replica that never saw it and hand it to someone else.
    ///
    /// ```
    /// use distlock::LockError;
    /// use std::time::Duration;
    ///
    /// let err = LockError::ReplicasNotAcknowledged {
    ///     key: "order:7".into(),
    ///     acknowledged: 0,
    ///     wanted: 1,
    ///     timeout: Duration::from_millis(200),
    /// };
    /// assert!(err.to_string().starts_with(
    ///     "lock `order:7` was granted by the primary, but 0 of 1 replicas acknowledged it within 200ms"
    /// ));
    /// ```
    #[error("lock `{key}` was granted by the primary, but {acknowledged} of {wanted} replicas acknowledged it within {}; it was released again, since a failover could hand it to someone else. Check the replicas (`INFO replication` on the primary), or lower min_replicas", Rounded(*timeout))]
    ReplicasNotAcknowledged {
        /// The rendered key.
        key: String,
        /// Replicas that confirmed the write in time.
        acknowledged: u32,
        /// The `min_replicas` setting.
        wanted: u32,
        /// The `replica_timeout` setting.
        timeout: Duration,
    },
    /// A call nested in one that holds `key` asked for it in a way the outer hold does not
    /// cover: a write lock inside a read lock (upgrading is not supported: two readers upgrading
    /// would wait for each other forever), or a lock inside a semaphore permit (or the reverse).
    #[error("lock `{key}` is held as a {held} lock by an enclosing call, which does not cover a {wanted} lock: {advice}")]
    NestedKind {
        /// The key.
        key: String,
        /// How the enclosing call holds it.
        held: LockKind,
        /// How the nested call asked for it.
        wanted: LockKind,
        /// What to do instead.
        advice: &'static str,
    },
    /// The backend was shut down ([`Backend::shutdown`](crate::Backend::shutdown)): it takes no
    /// new locks.
    #[error(
        "lock backend `{backend}` is shut down and takes no new locks (the process is stopping)"
    )]
    ShutDown {
        /// The registry name, or where the backend is (see [`BackendError::backend`]).
        backend: String,
    },
    /// `checkpoint()` was called outside a locked call.
    #[error("no lock is held here: distlock::checkpoint() only works inside a locked call (an annotated fn or Lock::run), in the same task")]
    NoContext,
    /// The lock server failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
}

impl LockError {
    /// `true` for [`LockError::Busy`].
    pub fn is_busy(&self) -> bool {
        matches!(self, LockError::Busy { .. })
    }

    /// When to try again, for [`LockError::Busy`]: the holder's remaining lease as the server
    /// reported it at the last try (see the field's docs); `None` for every other error, and for
    /// a `Busy` call that never reached the server.
    ///
    /// ```
    /// # async fn handler() -> Result<(), distlock::LockError> {
    /// match distlock::Lock::new("order:7").acquire().await {
    ///     Ok(guard) => guard.release().await.map(drop),
    ///     Err(busy) if busy.is_busy() => {
    ///         let retry = busy.retry_after().unwrap_or(std::time::Duration::from_secs(1));
    ///         // e.g. answer HTTP 409 with `Retry-After: {retry}` rounded up to seconds.
    ///         # let _ = retry;
    ///         Err(busy)
    ///     }
    ///     Err(other) => Err(other),
    /// }
    /// # }
    /// ```
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            LockError::Busy { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// `true` for [`LockError::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, LockError::Lost { .. })
    }

    /// Why the lease was lost, for [`LockError::Lost`]; `None` for every other error.
    pub fn lost_reason(&self) -> Option<LostReason> {
        match self {
            LockError::Lost { reason, .. } => Some(*reason),
            _ => None,
        }
    }

    pub(crate) fn invalid_config(setting: impl Into<String>, problem: impl Into<String>) -> Self {
        LockError::InvalidConfig {
            setting: setting.into(),
            problem: problem.into(),
        }
    }
}

/// A wait, rounded for people: whole milliseconds, or microseconds below one.
/// A lock failure as an I/O error, so that functions returning `std::io::Result<T>` can be
/// annotated: the message is the [`LockError`]'s, which stays reachable as the
/// [`source`](std::error::Error::source) chain's first error (`io::Error::get_ref`,
/// `downcast`). The kind: `ResourceBusy` for [`Busy`](LockError::Busy), `Interrupted` for
/// [`Lost`](LockError::Lost), `TimedOut` for a backend failure whose outcome is unknown,
/// `InvalidInput` for a configuration, key or nesting the call cannot use, `Other` otherwise.
///
/// ```
/// use distlock::LockError;
/// use std::time::Duration;
///
/// let busy = LockError::Busy { key: "k".into(), waited: Duration::ZERO, retry_after: None };
/// let io = std::io::Error::from(busy);
/// assert_eq!(io.kind(), std::io::ErrorKind::ResourceBusy);
/// assert!(io.into_inner().unwrap().downcast::<LockError>().unwrap().is_busy());
/// ```
impl From<LockError> for std::io::Error {
    fn from(error: LockError) -> Self {
        use std::io::ErrorKind;
        let kind = match &error {
            LockError::Busy { .. } => ErrorKind::ResourceBusy,
            LockError::Lost { .. } => ErrorKind::Interrupted,
            LockError::Backend(failure) if failure.is_ambiguous() => ErrorKind::TimedOut,
            LockError::NotConfigured { .. }
            | LockError::InvalidConfig { .. }
            | LockError::InvalidKey { .. }
            | LockError::NestedKind { .. } => ErrorKind::InvalidInput,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, error)
    }
}

/// [`LockError::Busy`]'s message: what the call did, and when the lock may be free.
struct BusyMessage<'a> {
    key: &'a str,
    waited: Duration,
    retry_after: Option<Duration>,
}

impl fmt::Display for BusyMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lock `{}` is held by someone else (", self.key)?;
        match self.waited.is_zero() {
            true => f.write_str("a single try")?,
            false => write!(f, "waited {}", Rounded(self.waited))?,
        }
        if let Some(left) = self.retry_after {
            write!(f, "; the holder's lease ends in {}", Rounded(left))?;
        }
        let retry = match self.retry_after {
            Some(_) => "retry after that",
            None => "retry later",
        };
        match self.waited.is_zero() {
            true => write!(f, "); {retry} or allow a `wait`"),
            false => write!(f, "); {retry} or allow a longer `wait`"),
        }
    }
}

struct Rounded(Duration);

impl fmt::Display for Rounded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.0.as_millis();
        if millis == 0 {
            write!(f, "{}µs", self.0.as_micros())
        } else {
            write!(
                f,
                "{}",
                humantime::format_duration(Duration::from_millis(millis as u64))
            )
        }
    }
}
