//! [`Backend`]: the cheap, cloneable handle users register — an engine with the machinery every
//! engine shares (the watchdog, the local queues, stats, settings).

use crate::engines::engine::{Deployment, Engine, EngineFailure, Holder};
use crate::error::Operation;
use crate::hooks::SharedHooks;
use crate::lock::watchdog::Watchdog;
use crate::operating::stats::{Stats, StatsSnapshot};
use crate::wait::Gates;
use crate::{BackendError, Finding, LockError};
use once_cell::sync::Lazy;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Settings shared by every deployment; each builder setter documents its default.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Where the deployment is, without passwords: what errors of an unregistered backend name.
    pub(crate) location: String,
    pub(crate) prefix: String,
    pub(crate) watchdog_lease: Duration,
    pub(crate) max_key_len: usize,
    pub(crate) renew_batch: usize,
    /// How long a key passes between this process's tasks while another process waits for it.
    pub(crate) local_batch: Duration,
    pub(crate) max_backoff: Duration,
    /// Fraction of a lease's TTL taken off its validity for clock drift.
    pub(crate) drift_factor: f64,
}

/// The name of a backend that was never registered.
const UNREGISTERED: &str = "unregistered";

/// The smallest lease the library accepts: below it, clock drift and one round trip eat the lease.
pub const MIN_LEASE: Duration = Duration::from_millis(100);

/// A configured lock backend: a cheap `Clone` handle.
///
/// Build one with [`Backend::builder`] (or [`Backend::in_process`], [`Backend::redlock`]), then either register it by
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
///     .watchdog_lease(Duration::from_secs(10))
///     .build()
///     .expect("a valid URL");
/// assert_eq!(backend.prefix(), "billing");
/// ```
#[derive(Clone)]
pub struct Backend {
    pub(crate) inner: Arc<BackendInner>,
}

pub(crate) struct BackendInner {
    /// Set once, by the registry; shared so a metrics label of it copies no text.
    pub(crate) name: OnceLock<Arc<str>>,
    pub(crate) settings: Settings,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) watchdog: Watchdog,
    pub(crate) stats: Arc<Stats>,
    pub(crate) gates: Arc<Gates>,
    pub(crate) hooks: SharedHooks,
    pub(crate) deployment: Deployment,
    /// The key [`ping`](Backend::ping) probes, one per backend (so that its token marker is one
    /// key however often it pings); held while a ping runs, so pings take turns.
    pub(crate) ping_probe: tokio::sync::Mutex<String>,
    /// Set by [`shutdown`](Backend::shutdown): no new locks.
    pub(crate) closing: std::sync::atomic::AtomicBool,
    /// [`ping`](Backend::ping) found that the user may not ask about its rights.
    pub(crate) rights_unchecked: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name())
            .field("deployment", &self.inner.deployment)
            .field("prefix", &self.inner.settings.prefix)
            .finish()
    }
}

impl Backend {
    /// Hands `engine` to a new backend: the watchdog, local queues and stats every engine
    /// shares, around it.
    pub(crate) fn assemble(
        engine: Arc<dyn Engine>,
        settings: Settings,
        hooks: SharedHooks,
        deployment: Deployment,
    ) -> Backend {
        let stats = Arc::new(Stats::default());
        Backend {
            inner: Arc::new(BackendInner {
                name: OnceLock::new(),
                watchdog: Watchdog::new(engine.clone(), settings.renew_batch, stats.clone()),
                settings,
                engine,
                stats,
                gates: Arc::default(),
                hooks,
                deployment,
                closing: std::sync::atomic::AtomicBool::new(false),
                rights_unchecked: std::sync::atomic::AtomicBool::new(false),
                ping_probe: tokio::sync::Mutex::new(format!(
                    "__distlock_ping:{}",
                    crate::lock::owner::Owner::random().as_str()
                )),
            }),
        }
    }

    /// The registry name, or `"unregistered"` for a backend used only through [`Lock::on`](crate::Lock::on).
    pub fn name(&self) -> &str {
        self.inner.name.get().map_or(UNREGISTERED, |name| name)
    }

    /// [`name`](Self::name), shared: the `backend` label of the metrics.
    pub(crate) fn shared_name(&self) -> Arc<str> {
        static UNREGISTERED_SHARED: Lazy<Arc<str>> = Lazy::new(|| Arc::from(UNREGISTERED));
        self.inner
            .name
            .get()
            .unwrap_or(&UNREGISTERED_SHARED)
            .clone()
    }

    /// The deployment this backend talks to: one Redis server, Sentinel, a Cluster, Redlock,
    /// etcd or the in-process map.
    pub fn deployment(&self) -> Deployment {
        self.inner.deployment
    }

    /// The key namespace of this backend.
    pub fn prefix(&self) -> &str {
        &self.inner.settings.prefix
    }

    /// The TTL of watchdog leases (renewed every third of it).
    pub fn watchdog_lease(&self) -> Duration {
        self.inner.settings.watchdog_lease
    }

    /// Counters since start-up: acquisitions, busy results, lost leases, renewals, wait times.
    pub fn stats(&self) -> StatsSnapshot {
        self.inner.stats.snapshot()
    }

    /// Who holds `key` (a key as the lock was given it, before prefixing), for how long, with which
    /// token; `None` when it is free.
    ///
    /// # Errors
    /// - [`LockError::InvalidKey`] for a key no lock can have: empty, longer than
    ///   [`max_key_len`](crate::BackendBuilder::max_key_len), or holding `{`, `}` or a control
    ///   character.
    /// - [`LockError::Backend`] when the server did not answer, refused the command, or answered
    ///   what distlock did not write.
    ///
    /// # Cancel safety
    /// This method is cancel safe. It only reads: dropping the future changes nothing.
    pub async fn inspect(&self, key: &str) -> Result<Option<Holder>, LockError> {
        crate::lock::key::validate(key, self.inner.settings.max_key_len)?;
        self.inner
            .engine
            .inspect(key)
            .await
            .map_err(|failure| self.backend_error(Operation::Inspect, failure))
    }

    /// Checks the lock server for settings that quietly weaken locks: an eviction policy other
    /// than `noeviction`, no persistence, replicas lagging. Empty when nothing was found (always,
    /// for the in-process backend). Needs `CONFIG GET` and `INFO`, which a lock user's ACL does
    /// not grant: run it with an operator's credentials.
    ///
    /// # Errors
    /// [`LockError::Backend`] when the server could not be asked: unreachable, or no answer in
    /// time. Some failures are findings instead: on Redlock, a master that does not answer
    /// (`unreachable`); anywhere, a setting the user may not read (`unchecked`).
    ///
    /// # Cancel safety
    /// This method is cancel safe. It only reads: dropping the future changes nothing.
    pub async fn doctor(&self) -> Result<Vec<Finding>, LockError> {
        self.inner
            .engine
            .doctor()
            .await
            .map_err(|failure| self.backend_error(Operation::Doctor, failure))
    }

    /// [`LockError::ShutDown`] once [`shutdown`](Self::shutdown) began.
    pub(crate) fn refuse_when_closing(&self) -> Result<(), LockError> {
        match self
            .inner
            .closing
            .load(std::sync::atomic::Ordering::Acquire)
        {
            true => Err(LockError::ShutDown {
                backend: self.error_name().to_owned(),
            }),
            false => Ok(()),
        }
    }

    /// The registry name, or — for a backend used only through [`Lock::on`](crate::Lock::on) —
    /// where it is (its URL without passwords): what errors call the backend.
    pub(crate) fn error_name(&self) -> &str {
        match self.inner.name.get() {
            Some(name) => name,
            None => &self.inner.settings.location,
        }
    }

    pub(crate) fn backend_error(&self, operation: Operation, failure: EngineFailure) -> LockError {
        self.failure(operation, failure.ambiguous, failure.source)
    }

    /// [`LockError::Backend`] for `operation` of this backend, saying `what` went wrong.
    pub(crate) fn failure(
        &self,
        operation: Operation,
        ambiguous: bool,
        what: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> LockError {
        LockError::Backend(BackendError::new(
            self.error_name(),
            operation,
            ambiguous,
            what,
        ))
    }

    /// A second client of the same engine: same server (or in-process map) and settings, but its
    /// own local queues, watchdog, stats and hooks — as another process would have.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn another_client(&self) -> Backend {
        Backend::assemble(
            self.inner.engine.clone(),
            self.inner.settings.clone(),
            self.inner.hooks.for_another_client(),
            self.inner.deployment,
        )
    }

    pub(crate) fn same_as(&self, other: &Backend) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}
