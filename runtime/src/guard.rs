//! [`LockGuard`]: a held lock, and its release.

use crate::acquire::MAX_FAILED_ATTEMPTS;
use crate::backend::{Backend, Ownership};
use crate::context::{self, Frame};
use crate::lease::HeldLease;
use crate::stats::Stats;
use crate::watchdog::LeaseId;
use crate::{LockError, OnLost};
use std::future::Future;
use std::sync::Arc;
use tracing::Instrument;

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

/// One key of a guard: its lease and its watchdog registration.
pub(crate) struct Held {
    pub(crate) id: LeaseId,
    pub(crate) lease: Arc<HeldLease>,
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
    held: Vec<Held>,
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
    pub(crate) fn new(backend: Backend, keys: usize) -> Self {
        LockGuard {
            backend,
            held: Vec::with_capacity(keys),
        }
    }

    pub(crate) fn push(&mut self, held: Held) {
        self.held.push(held);
    }

    fn leases(&self) -> impl Iterator<Item = &Arc<HeldLease>> {
        self.held.iter().map(|held| &held.lease)
    }

    /// The fencing token of the first key (in canonical order).
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

    /// `Ok` while every key is held and valid, `Err(LockError::Lost)` otherwise.
    pub fn check(&self) -> Result<(), LockError> {
        self.leases().try_for_each(|lease| lease.check())
    }

    /// `true` while every key is held and valid.
    pub fn is_held(&self) -> bool {
        self.check().is_ok()
    }

    /// Resolves when any key's lease is lost, with the `LockError::Lost` describing it.
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

    /// Stops renewal and releases every key. A key that had expired or was taken over is reported
    /// (a tracing warning and the backend's stats) and in the returned value, not as an error.
    pub async fn release(mut self) -> Result<Released, LockError> {
        let held = std::mem::take(&mut self.held);
        release_all(&self.backend, held).await
    }

    /// Runs `body` in the task-local context of this guard's keys, with the lost-lease policy.
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
        // Renewal stops now, whatever happens to the release below.
        for held in &self.held {
            self.backend.inner.watchdog.deregister(held.id);
        }
        let held = std::mem::take(&mut self.held);
        let backend = self.backend.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = release_all(&backend, held).await;
            });
        }
    }
}

async fn release_all(backend: &Backend, held: Vec<Held>) -> Result<Released, LockError> {
    for key in &held {
        backend.inner.watchdog.deregister(key.id);
    }
    let mut worst = Released::Released;
    let mut first_error = None;
    for key in held {
        match release_one(backend, &key.lease).await {
            Ok(Released::Released) => {}
            Ok(other) => worst = other,
            Err(err) => {
                first_error.get_or_insert(err);
            }
        }
        // Only now may the next local waiter contend: the server has seen our release.
        key.lease.pass_turn();
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(worst),
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
