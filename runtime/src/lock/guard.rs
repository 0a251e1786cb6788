//! [`LockGuard`]: a held lock, and its release.

use crate::backend::Backend;
use crate::error::LockError;
use crate::lock::context::{self, Frame};
use crate::lock::lease::HeldLease;
use crate::lock::policy::OnLost;
use crate::lock::release::{release_all, release_in_background, Released};
use crate::lock::watchdog::LeaseId;
use crate::operating::metrics::{Holding, Labels};
use crate::operating::stats::Stats;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// One key of a guard: its lease and its watchdog registration.
pub(crate) struct Held {
    pub(crate) id: LeaseId,
    pub(crate) lease: Arc<HeldLease>,
}

/// A held lock. Dropping it stops renewal at once and releases the lock in the background, one
/// round trip later; [`release`](Self::release) does it explicitly and reports the outcome.
///
/// # Dropping
/// Dropping the guard (or a future holding it) never leaks a renewal: the lease leaves the
/// watchdog synchronously in `Drop`. The release then runs on a task of the current tokio
/// runtime (the in-process backend releases right in `Drop`); with no runtime left to run it
/// (dropped outside one, or while it shuts down), the key expires by its TTL and is counted in
/// [`StatsSnapshot::left_to_expire`](crate::StatsSnapshot::left_to_expire).
pub struct LockGuard {
    backend: Backend,
    held: Vec<Held>,
    /// The keys held and the hold time, in the metrics; ends with `held`.
    holding: Holding,
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
    pub(crate) fn new(backend: Backend, keys: usize, labels: Labels) -> Self {
        LockGuard {
            backend,
            held: Vec::with_capacity(keys),
            holding: Holding::new(labels),
        }
    }

    pub(crate) fn push(&mut self, held: Held) {
        self.held.push(held);
        self.holding.lease_taken();
    }

    /// Every key is held: the guard is handed to the caller.
    pub(crate) fn complete(&mut self) {
        self.holding.complete();
    }

    pub(crate) fn leases(&self) -> impl Iterator<Item = &Arc<HeldLease>> {
        self.held.iter().map(|held| &held.lease)
    }

    /// The backend the locks are on.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The fencing token of the first key (in canonical order): larger than every token
    /// granted for the key before. 0 for an efficiency lock (a backend built with
    /// [`fencing_tokens(false)`](crate::BackendBuilder::fencing_tokens)), which has none; a
    /// fenced resource refuses it.
    pub fn fencing_token(&self) -> u64 {
        self.leases().next().map_or(0, |lease| lease.fence)
    }

    /// Every key with its fencing token, in canonical order.
    pub fn fencing_tokens(&self) -> impl Iterator<Item = (&str, u64)> {
        self.leases().map(|lease| (lease.key.as_str(), lease.fence))
    }

    /// The keys held, in canonical order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.leases().map(|lease| lease.key.as_str())
    }

    /// `Ok` while every key is held and valid.
    ///
    /// # Errors
    /// [`LockError::Lost`] for the first key (in canonical order) whose lease is lost or whose
    /// validity ran out, with the reason.
    pub fn check(&self) -> Result<(), LockError> {
        self.leases().try_for_each(|lease| lease.check())
    }

    /// `true` while every key is held and valid.
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// Resolves when any key's lease is lost, with the `LockError::Lost` describing it.
    ///
    /// # Cancel safety
    /// This method is cancel safe. It only observes: dropping the future changes nothing, and
    /// it can be awaited again.
    pub async fn lost(&self) -> LockError {
        let losses = self.leases().map(|lease| {
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

    /// Extends a fixed lease ([`Lease::Fixed`](crate::Lease::Fixed), `lease = "10s"`) by `by`:
    /// on the server, every key's TTL becomes what is left of its lease plus `by`, checked
    /// against its owner token (as a renewal is); locally, each lease's validity moves forward
    /// from when the request was sent, as a renewal's does. redsync's and rslock's `extend`, with
    /// the same safety as distlock's renewals.
    ///
    /// ```
    /// # use distlock::{Backend, Lease, Lock};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// # let backend = Backend::in_process();
    /// let guard = Lock::new("report:7")
    ///     .on(&backend)
    ///     .lease(Lease::Fixed(Duration::from_secs(10)))
    ///     .acquire()
    ///     .await?;
    /// // … the report takes longer than planned:
    /// guard.extend(Duration::from_secs(10)).await?;
    /// guard.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// - [`LockError::Lost`] when a key's lease is gone (expired, or found taken over or deleted
    ///   by this extension): the lock is not extended, and is not ours.
    /// - [`LockError::InvalidConfig`] for a watchdog lease, which the watchdog renews for as long
    ///   as the call runs (there is nothing to extend: bound it with `max_hold` instead), and for
    ///   a lock handed over by another process moments ago whose confirmation is still under way
    ///   (a third of the grant time, at most 100 ms by default): the confirmation renews it to
    ///   its TTL, and an extension racing it could be undone on the server.
    /// - [`LockError::Backend`] when the server did not answer: the extension may or may not have
    ///   happened, and the lease's validity stays where it was (safe: the server's TTL is never
    ///   shorter than that).
    ///
    /// # Cancel safety
    /// This method is cancel safe. An extension sent but not confirmed may lengthen the keys'
    /// TTLs on the server, never the local validity, so the guard's view stays conservative;
    /// calling it again is safe, and dropping the guard still releases the keys.
    pub async fn extend(&self, by: Duration) -> Result<(), LockError> {
        self.check()?;
        if self.leases().any(|lease| lease.renewing) {
            return Err(LockError::invalid_config(
                "lease",
                "is renewed by the watchdog while the call runs, so extend() has nothing to \
                 extend; it is for a fixed lease (`lease = \"10s\"`, Lease::Fixed). Bound a \
                 watchdog lease with max_hold instead",
            ));
        }
        if self.leases().any(|lease| lease.confirming()) {
            return Err(LockError::invalid_config(
                "extend",
                "came while the lock, handed over by another process moments ago, is still being \
                 confirmed (within a third of its grant time); extend it after that",
            ));
        }
        crate::lock::extend::extend(&self.backend, self.leases(), by).await?;
        self.check()
    }

    /// Stops renewal and releases every key. A key that had expired or was taken over is reported
    /// (a tracing warning and the backend's stats) and in the returned value, not as an error.
    /// A key whose release the server did not confirm (unreachable, a failover under way) is the
    /// returned error, and its release goes on in the background, with backoff, until its lease
    /// would have expired anyway.
    ///
    /// # Errors
    /// [`LockError::Backend`] for the first key whose release the server did not confirm in
    /// three tries (unreachable, no answer in time, a failover under way). Every other key's
    /// release was still made, and the releases that failed go on in the background. A key
    /// found expired or taken over is not an error: see [`Released`].
    ///
    /// # Cancel safety
    /// This method is cancel safe: only its outcome is lost. Dropping this future before it
    /// completes, even with a release in flight, finishes the release in the background: the
    /// keys are free one round trip later either way. (With no runtime left to run it, they
    /// expire by their TTL, counted in
    /// [`StatsSnapshot::left_to_expire`](crate::StatsSnapshot::left_to_expire).)
    pub async fn release(mut self) -> Result<Released, LockError> {
        let leases = self.take_leases();
        release_all(&self.backend, leases).await
    }

    /// Takes every lease out of the guard and out of the watchdog: renewal stops now, and the
    /// call no longer holds the lock.
    fn take_leases(&mut self) -> Vec<Arc<HeldLease>> {
        self.holding.end();
        let held = std::mem::take(&mut self.held);
        held.into_iter()
            .map(|held| {
                self.backend.inner.watchdog.deregister(held.id);
                held.lease
            })
            .collect()
    }

    /// Runs `body` in the task-local context of this guard's keys, with the lost-lease policy.
    ///
    /// # Cancel safety
    /// As cancel safe as `body`.
    /// Dropping the future drops the body; the guard, owned by the caller, releases when it is
    /// dropped in turn.
    pub(crate) async fn run_body<F: Future>(
        &self,
        on_lost: OnLost,
        parent: Option<Arc<Frame>>,
        body: F,
    ) -> Result<F::Output, LockError> {
        let frame = Arc::new(Frame {
            backend: self.backend.clone(),
            leases: self.leases().cloned().collect(),
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
        if self.held.is_empty() {
            return;
        }
        // Renewal stops now, whatever happens to the release.
        let leases = self.take_leases();
        release_in_background(self.backend.clone(), leases.into(), false);
    }
}
