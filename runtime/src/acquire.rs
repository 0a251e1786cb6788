//! Acquiring one key: take the process-local turn, then contend on the server — one round trip
//! when the lock is free, release notifications plus jittered backoff while it is busy, and
//! same-owner retries when a reply is lost.

use crate::backend::{Acquired, Backend, TestHooks};
use crate::lease::HeldLease;
use crate::owner::Owner;
use crate::stats::Stats;
use crate::wait::{Backoff, Turn};
use crate::LockError;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// Consecutive failed round trips (errors, not "busy") after which an acquire gives up.
pub(crate) const MAX_FAILED_ATTEMPTS: u32 = 3;

/// One key's acquisition, with the settings shared by all keys of one lock.
pub(crate) struct Request<'a> {
    pub(crate) backend: &'a Backend,
    pub(crate) ttl: Duration,
    pub(crate) renewing: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) started: Instant,
    /// End of the wait budget; `None` waits forever.
    pub(crate) deadline: Option<Instant>,
}

impl Request<'_> {
    /// Acquires `key`; the returned turn must be kept until the key is released, so that the
    /// next local waiter contends only after the release.
    pub(crate) async fn acquire(&self, key: String) -> Result<(Arc<HeldLease>, Turn), LockError> {
        let span = tracing::info_span!(
            "distlock.acquire",
            key = %key,
            attempts = tracing::field::Empty,
            waited_us = tracing::field::Empty,
        );
        async {
            let Some(mut turn) = self.backend.inner.gates.enter(&key, self.deadline).await else {
                return Err(self.busy(key));
            };
            let lease = self.contend(key, &mut turn).await?;
            Ok((lease, turn))
        }
        .instrument(span)
        .await
    }

    fn busy(&self, key: String) -> LockError {
        Stats::bump(&self.backend.inner.stats.busy);
        LockError::Busy {
            key,
            waited: self.started.elapsed(),
        }
    }

    async fn contend(&self, key: String, turn: &mut Turn) -> Result<Arc<HeldLease>, LockError> {
        let inner = &self.backend.inner;
        let store = &*inner.store;
        let owner = Owner::random();
        // Made on the first busy reply: an uncontended acquire never reads the test hooks.
        let mut waiting: Option<(Backoff, TestHooks)> = None;
        let mut attempts = 0u32;
        let mut failed_in_a_row = 0u32;
        let mut maybe_taken = false;
        let mut subscribed_since_last_wait = false;
        loop {
            attempts += 1;
            let sent_at = Instant::now();
            let outcome = store.acquire(&key, &owner, self.ttl).await;
            let span = tracing::Span::current();
            span.record("attempts", attempts);
            span.record("waited_us", self.started.elapsed().as_micros() as u64);
            match outcome {
                Ok(Acquired::Yes { fence }) => {
                    Stats::bump(&inner.stats.acquired);
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
                    let remaining = self
                        .deadline
                        .map(|deadline| deadline.saturating_duration_since(Instant::now()));
                    if remaining == Some(Duration::ZERO) {
                        return Err(self.busy(key));
                    }
                    let (backoff, hooks) = waiting.get_or_insert_with(|| {
                        let hooks = *inner.hooks.lock().unwrap_or_else(|e| e.into_inner());
                        let backoff = Backoff::new(inner.settings.max_backoff)
                            .with_floor(hooks.backoff_floor);
                        (backoff, hooks)
                    });
                    let confirmed = turn
                        .watch
                        .as_ref()
                        .is_some_and(|watch| watch.is_confirmed());
                    if !confirmed && !subscribed_since_last_wait {
                        // Subscribe, then check again: a release between the busy reply above
                        // and the subscription is caught by the re-check. (The new watch is
                        // registered before the old one, if any, is dropped.)
                        if !hooks.subscribe_delay.is_zero() {
                            tokio::time::sleep(hooks.subscribe_delay).await;
                        }
                        turn.watch = Some(store.watch(&key).await);
                        subscribed_since_last_wait = true;
                        continue;
                    }
                    // An unconfirmed subscription (the server did not answer) is retried once
                    // per backoff period, never in a tight loop.
                    subscribed_since_last_wait = false;
                    let watch = turn.watch.as_mut().expect("subscribed above");
                    let delay = backoff.next_delay(remaining, holder_ttl);
                    tokio::select! {
                        () = watch.released() => {}
                        () = tokio::time::sleep(delay) => {}
                    }
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
