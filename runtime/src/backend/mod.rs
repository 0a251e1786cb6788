//! Backends: where locks live. [`Backend`] is the cheap, cloneable handle users register; each
//! engine (one Redis, the in-process map) implements the crate-private [`Store`] trait.

pub(crate) mod builder;
pub(crate) mod in_process;
pub(crate) mod redis;

pub use builder::BackendBuilder;

use crate::doctor::Finding;
use crate::hooks::SharedHooks;
use crate::owner::Owner;
use crate::stats::{Stats, StatsSnapshot};
use crate::wait::{Gates, ReleaseWatch};
use crate::watchdog::Watchdog;
use crate::{BackendError, LockError};
use futures_util::future::BoxFuture;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// What an acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The lock is ours, with this fencing token.
    Yes { fence: u64 },
    /// Another owner holds it for about `ttl` more (None when the server could not say).
    Busy { ttl: Option<Duration> },
}

/// What a release or a renewal found on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Ours: released or renewed.
    Ours,
    /// The key is gone (expired, deleted).
    Gone,
    /// Another owner holds the key.
    Foreign,
}

/// One lease in a batched renewal.
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a Owner,
    pub(crate) ttl: Duration,
}

/// Who holds a lock, as [`Backend::inspect`] reports it.
///
/// Its `Debug` output shows only the first six characters of the owner token, which is a
/// credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's owner token. It is a credential (whoever has it can release the lock): keep
    /// it out of logs.
    pub owner: String,
    /// The fencing token issued to the holder.
    pub fencing_token: u64,
    /// How long the lock lives unless renewed.
    pub ttl: Duration,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.owner.get(..6).unwrap_or("");
        f.debug_struct("Holder")
            .field("owner", &format_args!("{shown}…"))
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .finish()
    }
}

/// A failed store operation, before the backend adds its name.
#[derive(Debug)]
pub(crate) struct StoreFailure {
    pub(crate) ambiguous: bool,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

pub(crate) type StoreResult<T> = Result<T, StoreFailure>;

/// One lock engine. Every operation is a single atomic step on the server (one script call).
///
/// # Cancel safety
/// A future of these methods dropped after its request left may still have its effect on the
/// server, exactly like a lost reply; callers treat both the same way (the acquire path
/// releases with the owner token, the release path finishes in the background).
pub(crate) trait Store: Send + Sync + 'static {
    /// Take `key` for `owner` with a TTL, or find it busy. Already held by `owner`: refresh the TTL
    /// and return the token issued the first time (idempotent retry).
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquired>>;

    /// Delete `key` if `owner` holds it, and notify waiters.
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
    ) -> BoxFuture<'a, StoreResult<Ownership>>;

    /// Renew many leases in one call; one answer per lease, in order.
    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> BoxFuture<'a, StoreResult<Vec<Ownership>>>;

    /// Who holds `key` now.
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<Option<Holder>>>;

    /// Registers for `key`'s release notifications; resolves once the registration is in force
    /// on the server, so a check made after it cannot miss a release (subscribe-before-check).
    /// A transient failure (timeout, broken connection) still returns the registration,
    /// unconfirmed, and the waiter's backoff carries it until it subscribes again; a permanent
    /// one (the server refuses the subscription, e.g. NOPERM) is an error, never a silent
    /// fallback to polling.
    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<ReleaseWatch>>;

    /// Channels with at least one local waiter (for tests of cleanup).
    fn watched_channels(&self) -> usize;

    /// Server settings that weaken locks.
    fn doctor(&self) -> BoxFuture<'_, StoreResult<Vec<Finding>>>;
}

/// Settings shared by every backend kind; each builder setter documents its default.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) prefix: String,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) renew_batch: usize,
    pub(crate) max_backoff: Duration,
}

/// The smallest lease the library accepts: below it, clock drift and one round trip eat the lease.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A configured lock backend: a cheap `Clone` handle.
///
/// Build one with [`Backend::builder`] (or [`Backend::in_process`]), then either register it by
/// name in the [`Registry`](crate::Registry) (what annotated functions use) or hand it to
/// [`Lock::on`](crate::Lock::on).
///
/// # Behavior
/// - Connections are opened lazily on first use, inside the tokio runtime that uses the backend,
///   and reopened by themselves after a failure; a command in flight during a reconnect fails with
///   a [`LockError::Backend`] that the acquire path retries.
/// - One watchdog task per backend renews every live watchdog lease in batched script calls.
///
/// ```
/// use distlock::Backend;
/// use std::time::Duration;
///
/// let backend = Backend::builder("redis://127.0.0.1:6379")
///     .prefix("billing")
///     .watchdog_timeout(Duration::from_secs(10))
///     .build()
///     .expect("a valid URL");
/// assert_eq!(backend.prefix(), "billing");
/// ```
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
}

pub(crate) struct BackendInner {
    pub(crate) name: OnceLock<String>,
    pub(crate) settings: Settings,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) watchdog: Watchdog,
    pub(crate) stats: Stats,
    pub(crate) gates: Arc<Gates>,
    pub(crate) hooks: SharedHooks,
    pub(crate) kind: &'static str,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name())
            .field("kind", &self.inner.kind)
            .field("prefix", &self.inner.settings.prefix)
            .finish()
    }
}

impl Backend {
    /// A builder for a backend at `url`: `redis://host:port/db`, `rediss://…` (feature `tls`),
    /// `redis+unix:///path` / `unix:///path`, or `memory://` for the in-process backend.
    pub fn builder(url: impl Into<String>) -> BackendBuilder {
        BackendBuilder::new(url.into())
    }

    /// The in-process backend: the same semantics as Redis (TTL expiry, ownership, fencing,
    /// validity) inside this process, for demos and unit tests.
    ///
    /// ```
    /// let backend = distlock::Backend::in_process();
    /// # let _ = backend;
    /// ```
    pub fn in_process() -> Backend {
        Backend::in_process_builder()
            .build()
            .expect("the default settings are valid")
    }

    /// A builder for the in-process backend, to adjust its settings.
    pub fn in_process_builder() -> BackendBuilder {
        BackendBuilder::new("memory://".into())
    }

    /// The registry name, or `"unregistered"` for a backend used only through [`Lock::on`](crate::Lock::on).
    pub fn name(&self) -> &str {
        self.inner.name.get().map_or("unregistered", String::as_str)
    }

    /// The key namespace of this backend.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The TTL of watchdog leases (renewed every third of it).
    pub fn watchdog_timeout(&self) -> Duration {
        self.inner.settings.watchdog_timeout
    }

    /// Counters since start-up: acquisitions, busy results, lost leases, renewals, wait times.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Who holds `key` (a key as the lock was given it, before prefixing), for how long, with which
    /// token; `None` when it is free.
    ///
    /// # Cancel safety
    /// Read-only: dropping the future changes nothing.
    pub async fn inspect(&self, key: &str) -> Result<Option<Holder>, LockError> {
        crate::key::validate(key, self.inner.settings.max_key_len)?;
        self.inner
            .store
            .inspect(key)
            .await
            .map_err(|failure| self.backend_error("inspect", failure))
    }

    /// Checks the lock server for settings that quietly weaken locks: an eviction policy other
    /// than `noeviction`, no persistence, replicas lagging. Empty when nothing was found (always,
    /// for the in-process backend). Needs `CONFIG GET` and `INFO`, which a lock user's ACL does
    /// not grant: run it with an operator's credentials.
    ///
    /// # Cancel safety
    /// Read-only: dropping the future changes nothing.
    pub async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        self.inner
            .store
            .doctor()
            .await
            .map_err(|failure| self.backend_error("doctor", failure))
    }

    pub(crate) fn backend_error(
        &self,
        operation: &'static str,
        failure: StoreFailure,
    ) -> LockError {
        LockError::Backend(BackendError::new(
            self.name(),
            operation,
            failure.ambiguous,
            failure.source,
        ))
    }

    /// A second client of the same engine: same server (or in-process map) and settings, but its
    /// own local queues, watchdog, stats and hooks — as another process would have.
    pub(crate) fn another_client(&self) -> Backend {
        Backend {
            inner: Arc::new(BackendInner {
                name: OnceLock::new(),
                settings: self.inner.settings.clone(),
                store: self.inner.store.clone(),
                watchdog: Watchdog::default(),
                stats: Stats::default(),
                gates: Arc::default(),
                hooks: SharedHooks::default(),
                kind: self.inner.kind,
            }),
        }
    }

    pub(crate) fn same_as(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
