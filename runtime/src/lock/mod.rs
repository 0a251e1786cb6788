//! The programmatic lock: [`Lock`], a builder that runs a future under the lock or returns a
//! [`LockGuard`].

pub(crate) mod acquire;
pub(crate) mod context;
pub(crate) mod extend;
pub(crate) mod guard;
pub(crate) mod key;
pub(crate) mod kind;
pub(crate) mod lease;
pub(crate) mod owner;
pub(crate) mod policy;
pub(crate) mod release;
pub(crate) mod watchdog;

use crate::backend::registry::{Registry, DEFAULT_BACKEND};
use crate::backend::{Backend, MIN_LEASE};
use crate::error::LockError;
use crate::lock::acquire::Request;
use crate::lock::guard::{Held, LockGuard};
use crate::lock::kind::LockKind;
use crate::lock::lease::Terms;
use crate::lock::policy::{Lease, OnLost, Wait};
use crate::operating::metrics::{self, Labels, Template};
use std::borrow::Cow;
use std::future::Future;
use std::time::{Duration, Instant};

/// A lock to take: key(s), wait budget, lease, lost-lease policy, backend.
///
/// Either run a future under it ([`run`](Self::run)) or take a guard ([`acquire`](Self::acquire)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use distlock::{Backend, Lock, Lease};
/// use std::time::Duration;
///
/// let backend = Backend::in_process();
/// let total = Lock::new("invoice:17")
///     .on(&backend)
///     .wait(Duration::from_secs(1))
///     .lease(Lease::Watchdog)
///     .run(async { 40 + 2 })
///     .await?;
/// assert_eq!(total, 42);
///
/// let guard = Lock::new("invoice:17").on(&backend).acquire().await?;
/// let busy = Lock::new("invoice:17").on(&backend).acquire().await.unwrap_err();
/// assert!(busy.is_busy());
/// assert!(guard.fencing_token() > 0);
/// guard.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Lock does nothing until `.run(…)` or `.acquire()` is awaited"]
pub struct Lock {
    keys: Vec<String>,
    wait: Wait,
    lease: Lease,
    on_lost: OnLost,
    max_hold: Option<Duration>,
    backend: Target,
    template: Template,
    kind: LockKind,
}

#[derive(Debug, Clone)]
enum Target {
    Named(Cow<'static, str>),
    Handle(Backend),
}

impl Lock {
    /// A lock on one key, with the defaults: no waiting, a watchdog lease, `OnLost::Checkpoint`,
    /// the `"default"` backend.
    pub fn new(key: impl Into<String>) -> Lock {
        Lock::keys([key.into()])
    }

    /// A lock on several keys at once, all or none. Keys are taken in a canonical (sorted) order,
    /// so two calls locking the same keys in a different order cannot deadlock.
    pub fn keys<I, K>(keys: I) -> Lock
    where
        I: IntoIterator<Item = K>,
        K: Into<String>,
    {
        let mut keys: Vec<String> = keys.into_iter().map(Into::into).collect();
        keys.sort_unstable();
        keys.dedup();
        Lock {
            keys,
            wait: Wait::For(Duration::ZERO),
            lease: Lease::Watchdog,
            on_lost: OnLost::Checkpoint,
            max_hold: None,
            backend: Target::Named(Cow::Borrowed(DEFAULT_BACKEND)),
            template: Template::UNTEMPLATED,
            kind: LockKind::Exclusive,
        }
    }

    /// How the lock is shared: [`LockKind::Exclusive`] (the default: one holder, no readers),
    /// [`LockKind::Read`] (many readers, no writer), or [`LockKind::Permits`] (a semaphore).
    pub fn kind(mut self, kind: LockKind) -> Self {
        self.kind = kind;
        self
    }

    /// Wait at most `budget` in total for a busy lock. Default: zero (one try).
    pub fn wait(mut self, budget: Duration) -> Self {
        self.wait = Wait::For(budget);
        self
    }

    /// Wait until acquired.
    pub fn wait_forever(mut self) -> Self {
        self.wait = Wait::Forever;
        self
    }

    /// Set the wait policy. Default `Wait::For(Duration::ZERO)`.
    pub fn wait_policy(mut self, wait: Wait) -> Self {
        self.wait = wait;
        self
    }

    /// The lease kind. Default [`Lease::Watchdog`].
    pub fn lease(mut self, lease: Lease) -> Self {
        self.lease = lease;
        self
    }

    /// What [`run`](Self::run) does when the lease is lost. Default [`OnLost::Checkpoint`].
    pub fn on_lost(mut self, on_lost: OnLost) -> Self {
        self.on_lost = on_lost;
        self
    }

    /// Liveness cap: the watchdog stops renewing after this long, so a stuck call cannot hold the
    /// lock forever; the call then sees a lost lease. Default: none.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// The key's template: the key with its variable parts named rather than filled in, such as
    /// `"invoice:<id>"` for `Lock::new(format!("invoice:{id}"))`. With the `metrics` feature it
    /// is the `lock` label of every metric this lock emits (the metrics are listed in
    /// [the operating chapter](crate::guide::operating)); without it, it is not kept. It never
    /// changes the key.
    /// Default: `"untemplated"` — never the rendered key, which would make a time series per
    /// key. `#[distributed_lock]` sets it to the `key` (or `keys`) it was given.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// use distlock::{Backend, Lock};
    ///
    /// let backend = Backend::in_process();
    /// let id = 17;
    /// Lock::new(format!("invoice:{id}"))
    ///     .template("invoice:<id>")
    ///     .on(&backend)
    ///     .run(async {})
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn template(mut self, template: impl Into<Cow<'static, str>>) -> Self {
        self.template = Template::new(template.into());
        self
    }

    /// Use the backend registered under `name` in the global [`Registry`]. Default `"default"`.
    pub fn backend(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.backend = Target::Named(name.into());
        self
    }

    /// Use this backend directly, without the registry.
    pub fn on(mut self, backend: &Backend) -> Self {
        self.backend = Target::Handle(backend.clone());
        self
    }

    fn resolve_backend(&self) -> Result<Backend, LockError> {
        match &self.backend {
            Target::Named(name) => match crate::testing::scoped(name) {
                Some(backend) => Ok(backend),
                None => Registry::global().get(name),
            },
            Target::Handle(backend) => Ok(backend.clone()),
        }
    }

    /// Acquires every key (all or none) and returns the guard.
    ///
    /// Ambiguous failures (a timeout, a connection dropped after the request was sent) are retried
    /// at once with the same owner token, which the server treats as "already mine": a lost reply
    /// costs one more round trip, never a wait or a second token — up to three in a row, even
    /// with no wait budget. Other failures (a server down, a Redlock quorum lost for a moment) are
    /// retried after a backoff while the wait budget lasts; when it is spent the error is
    /// returned, and any lock the lost replies may have taken is released.
    ///
    /// # Errors
    /// Nothing is held when an error is returned: keys taken before the error are released first
    /// (all or none).
    /// - [`LockError::Busy`] when a key stayed held by another owner, or by another task of this
    ///   process, for the whole wait budget (or at the one try made without a
    ///   [`wait`](Self::wait)).
    /// - [`LockError::Backend`] when the server failed and the wait budget is spent (without one:
    ///   at the first failure; a lost reply is first retried at once, up to three in a row), or
    ///   refused the release notifications a waiting call subscribes to (a user without the rights
    ///   to the release channels).
    /// - [`LockError::ReplicasNotAcknowledged`] when, with
    ///   [`min_replicas`](crate::BackendBuilder::min_replicas), fewer replicas acknowledged the
    ///   grant in time; the lock was released again.
    /// - [`LockError::ShutDown`] once the backend was shut down ([`Backend::shutdown`]): before the
    ///   call, while it waited, or while its grant was on the way (the grant is given back).
    /// - [`LockError::InvalidKey`] for a key that is empty, longer than the backend's
    ///   [`max_key_len`](crate::BackendBuilder::max_key_len), or holds `{`, `}` or a control
    ///   character, and for a lock without keys ([`Lock::keys`] of nothing).
    /// - [`LockError::InvalidConfig`] for a fixed lease shorter than [`MIN_LEASE`] (100 ms), for
    ///   [`LockKind::Permits`] of 0 or over several keys, and when the `"default"` backend, built
    ///   from the environment at its first use, finds a bad variable (the error names it).
    /// - [`LockError::NotConfigured`] when the backend named by [`backend`](Self::backend)
    ///   (`"default"` unless set) is neither registered nor given by a [`testing`](crate::testing)
    ///   scope, nor, for `"default"`, set by `DISTLOCK_URL`.
    ///
    /// # Panics
    /// Panics when polled outside a Tokio runtime: taking a lock may start the backend's watchdog,
    /// the task that renews leases, with `tokio::spawn`. A call that has to wait (a busy lock, a
    /// failed round trip) uses Tokio's timers, which panic on a runtime built without its time
    /// driver.
    ///
    /// # Cancel safety
    /// This method is cancel safe. Dropped at any point, it leaves no lock held for longer than
    /// one round trip plus a small margin when the server answers (a background release that
    /// gets no answer is retried until the lease would have ended):
    /// - waiting for the local turn (another task of this process holds or contends for the
    ///   key): the waiter leaves the queue;
    /// - with an acquire request in flight, or after a reply was lost: the lock the request may
    ///   have taken is released in the background with its owner token, and the key's local turn
    ///   passes on once the server has seen that release;
    /// - waiting for a busy lock (subscribed to its release notifications): the turn passes on
    ///   at once and the subscription goes with the last local waiter;
    /// - handed a turn that carries a lock transferred by the previous local holder (or a place
    ///   in the lock's queue), before taking it: that lock is released (that place given
    ///   up) in the background and the turn passes on;
    /// - waiting in the lock's queue: the place is given up in the background (and a lock
    ///   handed over to it meanwhile released);
    /// - with some keys of a multi-key lock taken: they are released in the background.
    ///
    /// A background release needs a tokio runtime to run on; with none left (the runtime is
    /// shutting down), the lock expires by its TTL and is counted in
    /// [`StatsSnapshot::left_to_expire`](crate::StatsSnapshot::left_to_expire).
    pub async fn acquire(self) -> Result<LockGuard, LockError> {
        let backend = self.resolve_backend()?;
        let keys = self.keys.clone();
        self.acquire_keys(backend, keys).await
    }

    /// Runs `body` while holding the lock, then releases it, whatever the body's outcome.
    ///
    /// Inside `body`, [`checkpoint()`](crate::checkpoint), [`fencing_token()`](crate::fencing_token)
    /// and [`is_held()`](crate::is_held) see this lock. Reentrant: keys this task already holds on
    /// the same backend (an enclosing `run` or annotated call) are not acquired again, and only
    /// the outermost call releases them. A failed release is logged, never returned: the body's
    /// work is done.
    ///
    /// # Errors
    /// - Every error of [`acquire`](Self::acquire), for the keys this call acquires; the body has
    ///   not run.
    /// - [`LockError::NestedKind`] when an enclosing call of this task holds one of the keys on the
    ///   same backend in a way that does not cover this lock (a write lock inside a read lock, a
    ///   semaphore and a lock on one key); the body has not run.
    /// - [`LockError::Lost`], with [`OnLost::Abort`] only, when a lease was lost before the body
    ///   finished; the body was dropped at the `.await` it had reached. With [`OnLost::Checkpoint`]
    ///   and [`OnLost::Ignore`] the body's output is returned even after a loss: a
    ///   [`checkpoint()`](crate::checkpoint) in the body reports it through the body's own output.
    ///
    /// When every key is held already by an enclosing call, nothing is acquired, and only the
    /// backend's lookup (as in `acquire`) and `NestedKind` can fail.
    ///
    /// # Panics
    /// As [`acquire`](Self::acquire), when the call acquires a key.
    ///
    /// # Cancel safety
    /// Cancel safe for the lock; the work is only as cancel safe as `body`, which is dropped
    /// wherever it stands. Dropping this future (a disconnected client's handler,
    /// `tokio::time::timeout`, `select!`) at any point leaves no lock held for longer than one
    /// round trip plus a small margin when the server answers, nor past its lease when it does
    /// not: while acquiring, as for [`acquire`](Self::acquire);
    /// during the body, the body is dropped, renewal stops at once and the lock is released in
    /// the background; with the release in flight, the release is finished in the background
    /// (freeing the lock a transfer to the next local task may have granted, too). The watchdog
    /// never renews for a dropped call. With no runtime left to run a background release, the
    /// lock expires by its TTL (counted in
    /// [`StatsSnapshot::left_to_expire`](crate::StatsSnapshot::left_to_expire)).
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let backend = self.resolve_backend()?;
        let parent = context::current();
        let mut missing = Vec::with_capacity(self.keys.len());
        for key in &self.keys {
            let held = parent
                .as_ref()
                .and_then(|frame| frame.held_as(&backend, key));
            match held {
                None => missing.push(key.clone()),
                Some(held) => covers(key, held, self.kind)?,
            }
        }
        if missing.is_empty() {
            return Ok(body.await);
        }
        let on_lost = self.on_lost;
        let guard = self.acquire_keys(backend, missing).await?;
        let output = guard.run_body(on_lost, parent, body).await;
        if let Err(err) = guard.release().await {
            tracing::warn!(target: "distlock::release", error = %err, "release failed; the lock expires with its TTL");
        }
        output
    }

    /// Acquires `keys` and counts the outcome.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// As `take_keys`; a cancelled acquisition counts no outcome in the metrics.
    async fn acquire_keys(
        self,
        backend: Backend,
        keys: Vec<String>,
    ) -> Result<LockGuard, LockError> {
        let labels = Labels::new(|| backend.shared_name(), &self.template);
        let started = Instant::now();
        let acquired = self.take_keys(backend, keys, &labels, started).await;
        metrics::acquisition(&labels, &acquired, started.elapsed());
        acquired
    }

    /// The lease's TTL and whether it is renewed, once the request is checked: a lease long
    /// enough, at least one key (one for a semaphore), a kind the engine supports, valid keys,
    /// a backend that is not shut down.
    fn check(&self, backend: &Backend, keys: &[String]) -> Result<(Duration, bool), LockError> {
        let (ttl, renewing) = match self.lease {
            Lease::Watchdog => (backend.watchdog_lease(), true),
            Lease::Fixed(ttl) if ttl < MIN_LEASE => {
                return Err(LockError::invalid_config(
                    "lease",
                    format!(
                        "is {}; a lease must be at least 100ms",
                        humantime::format_duration(ttl)
                    ),
                ))
            }
            Lease::Fixed(ttl) => (ttl, false),
        };
        if keys.is_empty() {
            return Err(LockError::InvalidKey {
                reason: "no key was given; a lock needs at least one".into(),
            });
        }
        backend.refuse_when_closing()?;
        match self.kind {
            LockKind::Permits(0) => {
                return Err(LockError::invalid_config(
                    "permits",
                    "is 0; a semaphore needs at least one permit",
                ))
            }
            LockKind::Permits(_) if keys.len() > 1 => {
                return Err(LockError::invalid_config(
                    "permits",
                    format!(
                        "is set for {} keys; a semaphore is one key (several keys are for \
                         all-or-none exclusive or read locks)",
                        keys.len()
                    ),
                ))
            }
            _ => {}
        }
        if let Err(why) = backend.inner.engine.supports(self.kind) {
            return Err(LockError::invalid_config("kind", why));
        }
        for key in keys {
            crate::lock::key::validate(key, backend.inner.settings.max_key_len)?;
        }
        Ok((ttl, renewing))
    }

    /// Checks the lock's settings, then takes `keys` one by one, in order, into one guard (all or
    /// none).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future drops the key's acquire in progress (see `Request::acquire`) and the
    /// guard, which releases the keys taken so far in the background; dropped while the guard
    /// releases them after a failure, that release finishes in the background.
    async fn take_keys(
        self,
        backend: Backend,
        keys: Vec<String>,
        labels: &Labels,
        started: Instant,
    ) -> Result<LockGuard, LockError> {
        let (ttl, renewing) = self.check(&backend, &keys)?;
        let deadline = match self.wait {
            Wait::For(budget) => Some(started + budget),
            Wait::Forever => None,
        };
        let mut guard = LockGuard::new(backend.clone(), keys.len(), labels.clone());
        for key in keys {
            let request = Request {
                backend: &backend,
                terms: Terms {
                    ttl,
                    drift_factor: backend.inner.settings.drift_factor,
                    renewing,
                    max_hold: self.max_hold,
                    kind: self.kind,
                },
                started,
                deadline,
                labels,
            };
            let lease = match request.acquire(key).await {
                Ok(lease) => lease,
                Err(err) => {
                    // All or none: free the keys taken so far before reporting.
                    let _ = guard.release().await;
                    return Err(err);
                }
            };
            // No await between the acquire's reply and here: the lease is owned by the guard
            // (released on drop) the moment the acquire future returns.
            let id = backend.inner.watchdog.register(lease.clone());
            guard.push(Held { id, lease });
        }
        // A grant that raced the backend's shutdown is given back: nothing is held past it.
        if let Err(closed) = backend.refuse_when_closing() {
            let _ = guard.release().await;
            return Err(closed);
        }
        backend.inner.stats.record_wait(started.elapsed());
        guard.complete();
        Ok(guard)
    }
}

/// Whether holding `key` as `held` (an enclosing call) covers a nested call asking for it as
/// `wanted`: a read inside a read or a write, a write inside a write, a permit inside a permit.
fn covers(key: &str, held: LockKind, wanted: LockKind) -> Result<(), LockError> {
    let advice = match (held, wanted) {
        (LockKind::Exclusive, LockKind::Exclusive | LockKind::Read)
        | (LockKind::Read, LockKind::Read)
        | (LockKind::Permits(_), LockKind::Permits(_)) => return Ok(()),
        (LockKind::Read, LockKind::Exclusive) => {
            "upgrading a read lock to a write lock is not supported (two readers upgrading \
             would wait for each other forever); take the write lock in the outer call"
        }
        _ => "a semaphore and a lock cannot nest on one key; use another key for one of them",
    };
    Err(LockError::NestedKind {
        key: key.to_owned(),
        held,
        wanted,
        advice,
    })
}
