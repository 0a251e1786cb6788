//! The programmatic lock: [`Lock`] (a builder) and [`LockGuard`] (a held lock).

use crate::backend::{Acquired, Backend, Ownership, MIN_LEASE};
use crate::context::{self, Frame};
use crate::lease::HeldLease;
use crate::owner::Owner;
use crate::registry::{Registry, DEFAULT_BACKEND};
use crate::stats::Stats;
use crate::wait::Backoff;
use crate::watchdog::LeaseId;
use crate::{Lease, Wait};
use crate::{LockError, OnLost};
use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Consecutive failed round trips (errors, not "busy") after which an acquire gives up.
const MAX_FAILED_ATTEMPTS: u32 = 3;

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
        }
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
            Target::Named(name) => Registry::global().get(name),
            Target::Handle(backend) => Ok(backend.clone()),
        }
    }

    /// Acquires every key (all or none) and returns the guard.
    ///
    /// Ambiguous failures (a timeout, a connection dropped after the request was sent) are retried
    /// with the same owner token, which the server treats as "already mine": a lost reply costs one
    /// more round trip, never a wait or a second token. After three failed round trips in a row
    /// the error is returned, and any lock the lost replies may have taken is released.
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
    /// Errors: acquisition failures, and with [`OnLost::Abort`] `LockError::Lost` when the lease
    /// was lost before the body finished.
    pub async fn run<F: Future>(self, body: F) -> Result<F::Output, LockError> {
        let backend = self.resolve_backend()?;
        let parent = context::current();
        let missing: Vec<String> = match &parent {
            Some(frame) => self
                .keys
                .iter()
                .filter(|key| !frame.holds(&backend, key))
                .cloned()
                .collect(),
            None => self.keys.clone(),
        };
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

    async fn acquire_keys(
        self,
        backend: Backend,
        keys: Vec<String>,
    ) -> Result<LockGuard, LockError> {
        let (ttl, renewing) = match self.lease {
            Lease::Watchdog => (backend.watchdog_timeout(), true),
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
        for key in &keys {
            crate::key::validate(key, backend.inner.settings.max_key_len)?;
        }
        let started = Instant::now();
        let deadline = match self.wait {
            Wait::For(budget) => Some(started + budget),
            Wait::Forever => None,
        };
        let mut guard = LockGuard {
            backend: backend.clone(),
            leases: Vec::with_capacity(keys.len()),
        };
        for key in keys {
            let request = Request {
                backend: &backend,
                ttl,
                renewing,
                max_hold: self.max_hold,
                started,
                deadline,
            };
            let lease = match request.acquire(key).await {
                Ok(lease) => lease,
                Err(err) => {
                    // All or none: free the keys taken so far before reporting.
                    let _ = guard.release().await;
                    return Err(err);
                }
            };
            let id = backend
                .inner
                .watchdog
                .register(&backend.inner, lease.clone());
            guard.leases.push((id, lease));
        }
        backend.inner.stats.record_wait(started.elapsed());
        Ok(guard)
    }
}

/// One key's acquisition.
struct Request<'a> {
    backend: &'a Backend,
    ttl: Duration,
    renewing: bool,
    max_hold: Option<Duration>,
    started: Instant,
    deadline: Option<Instant>,
}

impl Request<'_> {
    async fn acquire(&self, key: String) -> Result<Arc<HeldLease>, LockError> {
        let span = tracing::info_span!(
            "distlock.acquire",
            key = %key,
            attempts = tracing::field::Empty,
            waited_us = tracing::field::Empty,
        );
        self.acquire_inner(key).instrument(span).await
    }

    async fn acquire_inner(&self, key: String) -> Result<Arc<HeldLease>, LockError> {
        let store = &*self.backend.inner.store;
        let owner = Owner::random();
        let mut backoff = Backoff::default();
        let mut attempts = 0u32;
        let mut failed_in_a_row = 0u32;
        let mut maybe_taken = false;
        loop {
            attempts += 1;
            let sent_at = Instant::now();
            let outcome = store.acquire(&key, &owner, self.ttl).await;
            let span = tracing::Span::current();
            span.record("attempts", attempts);
            span.record("waited_us", self.started.elapsed().as_micros() as u64);
            match outcome {
                Ok(Acquired::Yes { fence }) => {
                    Stats::bump(&self.backend.inner.stats.acquired);
                    return Ok(Arc::new(HeldLease::new(
                        self.backend.clone(),
                        key,
                        owner,
                        fence,
                        self.ttl,
                        self.renewing,
                        sent_at,
                        self.max_hold,
                    )));
                }
                Ok(Acquired::Busy { ttl: holder_ttl }) => {
                    failed_in_a_row = 0;
                    let now = Instant::now();
                    let remaining = self
                        .deadline
                        .map(|deadline| deadline.saturating_duration_since(now));
                    if remaining == Some(Duration::ZERO) {
                        Stats::bump(&self.backend.inner.stats.busy);
                        return Err(LockError::Busy {
                            key,
                            waited: now - self.started,
                        });
                    }
                    let delay = backoff.next_delay(remaining, holder_ttl);
                    store.pause(&key, delay).await;
                }
                Err(failure) => {
                    failed_in_a_row += 1;
                    maybe_taken |= failure.ambiguous;
                    tracing::debug!(
                        target: "distlock::acquire",
                        attempt = attempts,
                        ambiguous = failure.ambiguous,
                        error = %failure.source,
                        "acquire round trip failed"
                    );
                    if failed_in_a_row >= MAX_FAILED_ATTEMPTS {
                        if maybe_taken {
                            release_in_background(self.backend.clone(), key, owner);
                        }
                        return Err(self.backend.backend_error("acquire", failure));
                    }
                }
            }
        }
    }
}

/// A lost reply may have left the lock taken under `owner`; free it rather than let it block
/// everyone for a whole TTL.
fn release_in_background(backend: Backend, key: String, owner: Owner) {
    if let Ok(runtime) = tokio::runtime::Handle::try_current() {
        runtime.spawn(async move {
            let _ = backend.inner.store.release(&key, &owner).await;
        });
    }
}

/// What a release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Released {
    /// The lock was ours and is now free.
    Released,
    /// The lock had already expired: for a while before the release, it protected nothing.
    Expired,
    /// Another owner held the key; it was left untouched.
    TakenOver,
}

/// A held lock. Dropping it stops renewal at once and releases the lock in the background (the
/// TTL is the backstop); [`release`](Self::release) does it explicitly and reports the outcome.
///
/// # Cancellation safety
/// Dropping the guard (or a future holding it) never leaks a renewal: the lease leaves the
/// watchdog synchronously in `Drop`, so the key expires within one TTL even if the background
/// release cannot run.
pub struct LockGuard {
    backend: Backend,
    leases: Vec<(LeaseId, Arc<HeldLease>)>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockGuard")
            .field("backend", &self.backend.name())
            .field("keys", &self.keys().collect::<Vec<_>>())
            .field("fencing_token", &self.fencing_token())
            .finish()
    }
}

impl LockGuard {
    /// The fencing token of the first key (in canonical order).
    pub fn fencing_token(&self) -> u64 {
        self.leases.first().map_or(0, |(_, lease)| lease.fence)
    }

    /// Every key with its fencing token, in canonical order.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, u64)> {
        self.leases
            .iter()
            .map(|(_, lease)| (lease.key.as_str(), lease.fence))
    }

    /// The keys held, in canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases.iter().map(|(_, lease)| lease.key.as_str())
    }

    /// `Ok` while every key is held and valid, `Err(LockError::Lost)` otherwise.
    pub fn check(&self) -> Result<(), LockError> {
        self.leases.iter().try_for_each(|(_, lease)| lease.check())
    }

    /// `true` while every key is held and valid.
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// Resolves when any key's lease is lost, with the `LockError::Lost` describing it.
    pub async fn lost(&self) -> LockError {
        let losses = self.leases.iter().map(|(_, lease)| {
            Box::pin(async move {
                let reason = lease.lost().await;
                LockError::Lost {
                    key: lease.key.clone(),
                    reason,
                }
            })
        });
        futures_util::future::select_all(losses).await.0
    }

    /// Stops renewal and releases every key. A key that had expired or was taken over is reported
    /// (a tracing warning and the backend's stats) and in the returned value, not as an error.
    pub async fn release(mut self) -> Result<Released, LockError> {
        let leases = std::mem::take(&mut self.leases);
        for (id, _) in &leases {
            self.backend.inner.watchdog.deregister(*id);
        }
        let mut worst = Released::Released;
        let mut first_error = None;
        for (_, lease) in &leases {
            match release_one(&self.backend, lease).await {
                Ok(Released::Released) => {}
                Ok(other) => worst = other,
                Err(err) => {
                    first_error.get_or_insert(err);
                }
            }
        }
        match first_error {
            Some(err) => Err(err),
            None => Ok(worst),
        }
    }

    async fn run_body<F: Future>(
        &self,
        on_lost: OnLost,
        parent: Option<Arc<Frame>>,
        body: F,
    ) -> Result<F::Output, LockError> {
        let frame = Arc::new(Frame {
            backend: self.backend.clone(),
            leases: self.leases.iter().map(|(_, lease)| lease.clone()).collect(),
            parent,
        });
        let body = context::scope(frame, body);
        let output = match on_lost {
            OnLost::Abort => {
                tokio::select! {
                    biased;
                    lost = self.lost() => return Err(lost),
                    output = body => output,
                }
            }
            OnLost::Checkpoint | OnLost::Ignore => body.await,
        };
        if let Err(lost) = self.check() {
            if on_lost == OnLost::Ignore {
                Stats::bump(&self.backend.inner.stats.lost_ignored);
            }
            tracing::warn!(
                target: "distlock::lost",
                error = %lost,
                policy = ?on_lost,
                "the locked call finished after its lease was lost"
            );
        }
        Ok(output)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        for (id, _) in &self.leases {
            self.backend.inner.watchdog.deregister(*id);
        }
        let leases = std::mem::take(&mut self.leases);
        let backend = self.backend.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                for (_, lease) in &leases {
                    let _ = release_one(&backend, lease).await;
                }
            });
        }
    }
}

/// Releases one key, retrying a round trip whose reply was lost (the script is idempotent: a
/// retry after a successful release finds the key gone, which then means "released").
async fn release_one(backend: &Backend, lease: &HeldLease) -> Result<Released, LockError> {
    let span =
        tracing::info_span!("distlock.release", key = %lease.key, fencing_token = lease.fence);
    async {
        let stats = &backend.inner.stats;
        let mut reply_lost = false;
        let mut attempt = 0;
        loop {
            attempt += 1;
            match backend.inner.store.release(&lease.key, &lease.owner).await {
                Ok(Ownership::Ours) => {
                    Stats::bump(&stats.released);
                    return Ok(Released::Released);
                }
                Ok(Ownership::Gone) if reply_lost => {
                    tracing::debug!(target: "distlock::release", "released; an earlier reply was lost");
                    Stats::bump(&stats.released);
                    return Ok(Released::Released);
                }
                Ok(Ownership::Gone) => {
                    Stats::bump(&stats.release_found_expired);
                    tracing::warn!(
                        target: "distlock::release",
                        key = %lease.key,
                        "the lock had expired before it was released; the work after its expiry was unprotected"
                    );
                    return Ok(Released::Expired);
                }
                Ok(Ownership::Foreign) => {
                    Stats::bump(&stats.release_found_foreign);
                    tracing::warn!(
                        target: "distlock::release",
                        key = %lease.key,
                        "another owner holds the lock now; left it untouched"
                    );
                    return Ok(Released::TakenOver);
                }
                Err(failure) if attempt < MAX_FAILED_ATTEMPTS => reply_lost |= failure.ambiguous,
                Err(failure) => return Err(backend.backend_error("release", failure)),
            }
        }
    }
    .instrument(span)
    .await
}
