//! Releasing: one ownership-checked round trip per key, retried when a reply is lost — and, when
//! the caller vanishes (a dropped future, a panic, a failed acquire whose reply never came), the
//! same release finished in the background, so a lock outlives its caller by one round trip, not
//! by a TTL.
//!
//! A release the server could not confirm (the server unreachable, a failover under way) is not
//! given up after a few quick tries: it goes on in the background, with backoff, until the lease
//! would have expired anyway — so a lock released during a failover is freed on the new primary
//! as soon as it is named, rather than held there for the rest of its TTL.
//!
//! Each key's local turn passes on as soon as the key's release request is on its way: the next
//! local waiter's acquire follows it on the same ordered connection, so the server runs the
//! release first and the waiter finds the key free — one round trip after the release, not two.
//! Where the engine can, a foreground release instead transfers the lock to that waiter in the
//! same script (a local transfer: one script per local transfer, and the turn passes with the
//! lock); a lock another process waits for is not transferred, and its turn passes once the
//! server has answered.
//! A background release passes the turn once the server has answered.

use crate::backend::Backend;
use crate::engines::engine::{EngineResult, GrantedAs, Ownership, Transfer};
use crate::error::Operation;
use crate::error::{LockError, LostReason};
use crate::lock::kind::LockKind;
use crate::lock::lease::HeldLease;
use crate::lock::owner::Owner;
use crate::lock::policy::MAX_FAILED_ATTEMPTS;
use crate::operating::metrics::{self, Labels};
use crate::operating::stats::Stats;
use crate::wait::{retry_until, Claimed, Successor, Transferred};
use futures_util::FutureExt;
use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};
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

impl Released {
    /// The `outcome` label of `distlock_releases_total`: the variant in snake case.
    const fn label(self) -> &'static str {
        match self {
            Released::Released => "released",
            Released::Expired => "expired",
            Released::TakenOver => "taken_over",
        }
    }
}

/// Releases every lease in order (the caller has already taken them out of the watchdog).
/// A key that had expired or was taken over is reported in the result and in the stats, not as
/// an error; the first failure is returned after every key was tried, and the keys that failed
/// go on being released in the background until their leases would have expired.
///
/// # Cancel safety
/// Cancel safe.
/// Dropping this future at any point hands the keys not yet confirmed released — including the
/// one whose release is in flight — to a background task that finishes the job.
pub(crate) async fn release_all(
    backend: &Backend,
    leases: Vec<Arc<HeldLease>>,
) -> Result<Released, LockError> {
    let mut rest = Unreleased {
        backend,
        leases: leases.into(),
        front_sent: false,
        transfer: None,
    };
    let mut worst = Released::Released;
    let mut first_error = None;
    while let Some(lease) = rest.leases.front() {
        // From here on the front key's release may have run on the server.
        rest.front_sent = true;
        let outcome = match successor_to_transfer_to(backend, lease) {
            Some((ticket, successor)) => {
                rest.transfer = Some(SuccessorLock::pledged(backend, lease, successor));
                transfer_one(backend, lease, ticket, &mut rest.transfer).await
            }
            None => pass_turn_once_sent(lease, release_one(backend, lease, false)).await,
        };
        rest.front_sent = false;
        let lease = rest
            .leases
            .pop_front()
            .expect("the front was just borrowed");
        lease.pass_turn();
        match outcome {
            Ok(Released::Released) => {}
            Ok(other) => worst = other,
            Err(err) => {
                // Its request may have run (a lost reply): the retries count "gone" as released.
                transfer_left_unfinished(&mut rest.transfer, &lease);
                release_in_background(backend.clone(), [lease].into(), true);
                first_error.get_or_insert(err);
            }
        }
    }
    match first_error {
        Some(err) => Err(err),
        None => Ok(worst),
    }
}

/// Runs `release` for `lease`, passing the key's local turn on as soon as the release request is
/// on its way (its first poll has handed it to the connection) rather than when it is answered:
/// the next local waiter's acquire then follows the release on the same ordered connection, the
/// server runs them in that order, and a local transfer costs one round trip instead of two. The
/// turn is only this process's queue order — the server's lock is what excludes — so passing it
/// early is never unsafe: if the acquire does overtake the release (a release queued for a batch,
/// a connection being re-established), it is answered "busy", marks the lock waited on, and the
/// release's notification wakes it.
///
/// # Cancel safety
/// Not cancel safe on its own: once polled, the release may still run.
/// Dropped before its first poll, nothing was sent and the lease keeps the turn. The first poll
/// never waits, so once polled the turn has passed, and dropping the future drops `release`,
/// which may still run on the server: the caller (`release_all`) hands the key to a
/// background release.
async fn pass_turn_once_sent<F: Future>(lease: &HeldLease, release: F) -> F::Output {
    // Unconstrained: tokio's cooperative budget must not make the first poll return before the
    // request is handed to the connection (the acquire behind it would then overtake it).
    let mut release = std::pin::pin!(tokio::task::unconstrained(release));
    let first_poll = std::future::poll_fn(|cx| Poll::Ready(release.as_mut().poll(cx))).await;
    if let Poll::Ready(outcome) = first_poll {
        return outcome;
    }
    lease.pass_turn();
    release.await
}

/// The task queued first behind `lease` in this process, if the engine can transfer the lock
/// to it: an exclusive lock granted with a token (not one whose acquire never answered). The
/// transfer may go ahead of other processes' queued waiters while the run of this process's
/// holders in a row is younger than the backend's `local_batch`.
fn successor_to_transfer_to(backend: &Backend, lease: &HeldLease) -> Option<(u64, Successor)> {
    let transfers = backend.inner.engine.transfers()
        && lease.kind == LockKind::Exclusive
        && !lease.is_unconfirmed();
    let (ticket, mut successor) = transfers.then(|| lease.successor()).flatten()?;
    successor.ahead_of_waiter = lease.run_started.elapsed() < backend.inner.settings.local_batch;
    Some((ticket, successor))
}

/// Releases `lease`'s lock and, unless others wait for it, transfers it in the same script to
/// the local task of `ticket` ([`Engine::transfer`](crate::engines::engine::Engine::transfer)), trying
/// a round trip whose reply was lost again (a transfer that ran answers again). The turn passes
/// on with the lock; a lock released instead passes it once the server has answered, and its
/// receiver asks for the lock.
///
/// `transfer` holds the lock the transfer may grant to the successor; it is taken out when the
/// outcome is known, and left in place when the release fails (the caller then releases that
/// lock, and this lease's, in the background: [`transfer_left_unfinished`]).
///
/// # Cancel safety
/// Not cancel safe on its own: the transfer may still run.
/// Dropped with a transfer in flight (or its reply lost), the successor's possible lock (or
/// place) stays in `transfer`, and `release_all` hands this lease's key to a background release
/// that frees the key if either token holds it ([`transfer_left_unfinished`]) — the successor
/// never uses the owner token it pledged unless the lock or place comes with its turn — and
/// passes the turn on once the server has seen it.
async fn transfer_one(
    backend: &Backend,
    lease: &HeldLease,
    ticket: u64,
    transfer: &mut Option<SuccessorLock>,
) -> Result<Released, LockError> {
    let span = tracing::info_span!(
        "distlock.release",
        key = %lease.key,
        fencing_token = lease.fence,
        background = false,
        transfer = true,
    );
    async {
        let mut reply_lost = false;
        let mut attempt = 0;
        if let Some(successor) = transfer.as_ref().and_then(|t| t.successor.as_ref()) {
            lease.expect_handover_to(&successor.owner);
        }
        loop {
            attempt += 1;
            let successor = transfer
                .as_ref()
                .and_then(|pending| pending.successor.as_ref())
                .expect("taken only on return");
            let outcome = backend
                .inner
                .engine
                .transfer(&lease.key, &lease.owner, successor)
                .await;
            #[cfg(distlock_test_hooks)]
            if let Ok(Transfer::Granted { .. } | Transfer::Queued { .. }) = outcome {
                let hooks = crate::hooks::read(&backend.inner.hooks);
                if !hooks.transfer_reply_delay.is_zero() {
                    tokio::time::sleep(hooks.transfer_reply_delay).await;
                }
                if hooks.lose_first_transfer_reply && attempt == 1 {
                    reply_lost = true;
                    continue;
                }
            }
            let handed = match outcome {
                Ok(Transfer::Granted { fence }) => Some((fence, None)),
                Ok(Transfer::Queued { grant }) => Some((0, Some(grant))),
                Ok(Transfer::Released(found)) => {
                    let pending = transfer.take();
                    if !reply_lost {
                        // Neither transferred nor queued (either would answer so again): the
                        // successor's token holds nothing.
                        if let Some(mut pending) = pending {
                            pending.successor = None;
                        }
                    }
                    // After a lost reply the successor may hold something all the same (a
                    // transfer or queueing that ran answers so again, but the key may have
                    // moved on since): it is released, or its place given up, in the background
                    // (the pending lock's drop), and the successor asks with a new token.
                    lease.pass_turn();
                    return Ok(settled(backend, lease, found, reply_lost));
                }
                Err(failure) if attempt < MAX_FAILED_ATTEMPTS => {
                    reply_lost |= failure.ambiguous;
                    None
                }
                Err(failure) => return Err(backend.backend_error(Operation::Release, failure)),
            };
            if let Some((fence, place)) = handed {
                let mut pending = transfer.take().expect("taken only on return");
                pending.fence = fence;
                pending.place = place;
                Stats::bump(&backend.inner.stats.released);
                metrics::released(&lease.labels, Released::Released.label());
                lease.pass_turn_transferred(ticket, Box::new(pending));
                return Ok(Released::Released);
            }
        }
    }
    .instrument(span)
    .await
}

/// A lock that a transfer granted, or may have granted, to a local successor: the releasing
/// call's until it passes the turn on with it, then the turn's receiver's. Dropped unclaimed —
/// the successor left before taking it — it is released in the background with the successor's
/// owner token; a releasing call that never learnt the transfer's outcome releases it with its
/// own lock instead, in one request ([`transfer_left_unfinished`]).
struct SuccessorLock {
    backend: Backend,
    key: String,
    labels: Labels,
    /// Taken when the lock is claimed, or known not to have been transferred.
    successor: Option<Successor>,
    fence: u64,
    /// The lock was handed to another process, and the successor queued for it for this grant
    /// time: what the turn carries is that place, not the lock.
    place: Option<Duration>,
    /// When the transfer was first sent: the successor's lease is valid from then.
    since: Instant,
    /// When the run of this process's holders in a row that the successor joins began.
    run_started: Instant,
}

impl SuccessorLock {
    /// The lock a transfer of `lease`'s key to `successor`, sent from now on, may grant.
    fn pledged(backend: &Backend, lease: &HeldLease, successor: Successor) -> SuccessorLock {
        SuccessorLock {
            backend: backend.clone(),
            key: lease.key.clone(),
            labels: lease.labels.clone(),
            successor: Some(successor),
            fence: 0,
            place: None,
            // Valid from the first send: the server grants no earlier than that.
            since: Instant::now(),
            run_started: lease.run_started,
        }
    }

    /// The lock as a lease to release, if it may still be held: the successor's owner token, in
    /// an unconfirmed lease (whose release counts any finding as done).
    fn unclaimed(&mut self) -> Option<HeldLease> {
        let successor = self.successor.take()?;
        Some(HeldLease::unconfirmed(
            self.backend.inner.stats.clone(),
            self.labels.clone(),
            std::mem::take(&mut self.key),
            successor.owner,
            LockKind::Exclusive,
            successor.ttl,
            None,
        ))
    }
}

/// The transfer of `holder`'s lock, in `transfer`, was left without a known outcome (the
/// releasing call was dropped, or its retries ran out): `holder`'s release from now on frees the
/// key if either its own token or the successor's pledged one holds it — or gives up the
/// successor's place in the queue — in one request ([`HeldLease::may_have_transferred_to`]).
/// Two releases, the successor's and then the holder's, would leave a moment between them in
/// which anyone can take the key, and the holder's would then find that lock and report the key
/// taken over.
fn transfer_left_unfinished(transfer: &mut Option<SuccessorLock>, holder: &HeldLease) {
    if let Some(successor) = transfer
        .take()
        .and_then(|mut pending| pending.successor.take())
    {
        holder.may_have_transferred_to(successor.owner);
    }
}

impl Transferred for SuccessorLock {
    fn claim(mut self: Box<Self>) -> Claimed {
        let owner = self.successor.take().expect("claimed once").owner;
        match self.place {
            None => Claimed::Lock {
                owner,
                fence: self.fence,
                since: self.since,
                run_started: self.run_started,
            },
            Some(grant) => Claimed::Place {
                owner,
                since: self.since,
                grant,
            },
        }
    }
}

impl Drop for SuccessorLock {
    fn drop(&mut self) {
        if let Some(lease) = self.unclaimed() {
            release_in_background(self.backend.clone(), [Arc::new(lease)].into(), true);
        }
    }
}

/// The keys a foreground release has not finished; released in the background if it is dropped.
struct Unreleased<'a> {
    backend: &'a Backend,
    leases: VecDeque<Arc<HeldLease>>,
    /// The front key's release request may have reached the server.
    front_sent: bool,
    /// The lock the front key's transfer, in flight, may have granted to the next local task.
    transfer: Option<SuccessorLock>,
}

impl Drop for Unreleased<'_> {
    fn drop(&mut self) {
        if let Some(front) = self.leases.front() {
            transfer_left_unfinished(&mut self.transfer, front);
        }
        if !self.leases.is_empty() {
            release_in_background(
                self.backend.clone(),
                std::mem::take(&mut self.leases),
                self.front_sent,
            );
        }
    }
}

/// Releases `lease` for [`Backend::shutdown`](crate::Backend::shutdown) (plainly: no local
/// transfer, the process's waiters are refused); `true` when the server answered.
///
/// # Cancel safety
/// Not cancel safe: the release may or may not have run.
/// Dropped midway (shutdown's bound), the release may or may not have run; the lease is left
/// to expire by its TTL, as a dead server would leave it.
pub(crate) async fn release_at_shutdown(backend: &Backend, lease: &HeldLease) -> bool {
    let released = release_one(backend, lease, false).await.is_ok();
    if released {
        lease.released_at_shutdown();
    }
    lease.pass_turn();
    released
}

/// Releases `leases` on a task of the current runtime, for a caller that cannot wait: a guard
/// dropped without [`LockGuard::release`](crate::LockGuard::release), a cancelled call, an
/// acquire whose reply was lost. `front_sent`: the first key's release (or, for an unconfirmed
/// lease, its acquire) may already have run.
///
/// An engine that answers at once (the in-process map) is released right here, runtime or not.
/// Otherwise, without a runtime to run it (outside one, or while it shuts down) the keys are left
/// to expire by their TTL, and counted in [`StatsSnapshot::left_to_expire`](crate::StatsSnapshot).
pub(crate) fn release_in_background(
    backend: Backend,
    leases: VecDeque<Arc<HeldLease>>,
    front_sent: bool,
) {
    let stats = &backend.inner.stats;
    stats
        .background_releases
        .fetch_add(leases.len() as u64, std::sync::atomic::Ordering::Relaxed);
    crate::hooks::local_changed();
    let rest = Abandoned { backend, leases };
    if rest.backend.inner.engine.answers_at_once() {
        // The in-process map: release here and now, runtime or not.
        rest.finish(front_sent)
            .now_or_never()
            .expect("an engine that answers at once answered");
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return; // `rest` counts the keys as left to expire.
    };
    runtime.spawn(rest.finish(front_sent));
}

/// Keys of a background release still to do. Dropped before the end — the runtime shut down
/// and dropped the task — they are counted as left to expire; nothing is spawned again, so a
/// shutting-down runtime cannot loop.
struct Abandoned {
    backend: Backend,
    leases: VecDeque<Arc<HeldLease>>,
}

impl Abandoned {
    /// Releases the keys in order, each key's turn passing on once the server has seen it (or
    /// has failed to). A key whose release fails goes on being tried on its own — after a
    /// backoff capped at the backend's `max_backoff`, until its lease would have expired: the
    /// server may be back (a new primary named, a cluster shard promoted) long before the TTL
    /// ends — while the keys behind it go ahead.
    ///
    /// # Cancel safety
    /// Never dropped by a caller.
    /// Runs as a spawned task (or at once, for an engine that answers at once), never dropped by a
    /// caller. Dropped by its runtime shutting down, the keys not yet done — the one in flight
    /// included — are counted as left to expire (`Abandoned`'s `Drop`) and expire by their TTL.
    async fn finish(mut self, front_sent: bool) {
        let mut maybe_released = front_sent;
        while let Some(lease) = self.leases.front().cloned() {
            let released = release_one(&self.backend, &lease, maybe_released).await;
            // Done with (or handed to its own retries): no longer this task's to count as left
            // to expire.
            self.leases.pop_front();
            maybe_released = false;
            lease.pass_turn();
            if let Err(failure) = released {
                let backend = self.backend.clone();
                tokio::spawn(retry_until_expiry(backend, lease, failure));
            }
        }
    }
}

/// Tries again to release a lock whose release failed (`failure`), after backoffs capped at
/// `max_backoff`, until it succeeds or the lease would have expired anyway. A failed round trip
/// may have run, so "gone" counts as released.
///
/// # Cancel safety
/// Never dropped by a caller.
/// Runs as a spawned task, never dropped by a caller; dropped by its runtime shutting down, it
/// stops trying (a release in flight may still run) and the lock expires by its TTL.
async fn retry_until_expiry(backend: Backend, lease: Arc<HeldLease>, failure: LockError) {
    let cap = backend.inner.settings.max_backoff;
    let released = retry_until(
        || lease.valid_until(),
        cap,
        failure,
        || async {
            let released = release_one(&backend, &lease, true).await;
            if let Err(err) = &released {
                tracing::debug!(
                    target: "distlock::release",
                    error = %err,
                    "background release failed; trying again until the lease would have expired"
                );
            }
            released
        },
    )
    .await;
    if let Err(err) = released {
        tracing::warn!(
            target: "distlock::release",
            key = %lease.key,
            error = %err,
            "the release kept failing until the lease ran out; the lock expires by its TTL"
        );
    }
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        if self.leases.is_empty() {
            return;
        }
        self.backend.inner.stats.left_to_expire.fetch_add(
            self.leases.len() as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        for lease in &self.leases {
            tracing::warn!(
                target: "distlock::release",
                key = %lease.key,
                "no runtime left to release the lock; it expires by its TTL"
            );
        }
    }
}

/// Releases one key, retrying a round trip whose reply was lost (the script is idempotent: a
/// retry after a successful release finds the key gone, which then means "released").
/// `maybe_released`: an earlier request for this key may have run already.
///
/// # Cancel safety
/// Not cancel safe on its own: a request already sent may still release the key.
/// Dropped after a request was sent, the key may be released already, as after a lost reply.
/// The foreground caller (`release_all`) then hands the key to a background release, which
/// counts "gone" as released; the background callers are dropped only with their runtime.
async fn release_one(
    backend: &Backend,
    lease: &HeldLease,
    maybe_released: bool,
) -> Result<Released, LockError> {
    let span = tracing::info_span!(
        "distlock.release",
        key = %lease.key,
        fencing_token = lease.fence,
        background = maybe_released,
    );
    async {
        if lease.was_released_at_shutdown() {
            return Ok(Released::Released);
        }
        let mut reply_lost = maybe_released;
        let mut attempt = 0;
        loop {
            attempt += 1;
            // After a lost reply the key may hold the marker of our own release already: a
            // conditional write would miss, so the script decides at once.
            let granted = match reply_lost {
                true => GrantedAs::Unknown,
                false => lease.granted_as(),
            };
            let outcome = match lease.transferred_to() {
                None => {
                    let engine = &backend.inner.engine;
                    engine
                        .release(&lease.key, &lease.owner, lease.kind, granted)
                        .await
                }
                Some(successor) => release_either(backend, lease, successor).await,
            };
            match outcome {
                // A lease whose acquire never answered: "gone" means that acquire never ran,
                // "ours" that it did and was just undone, "taken over" that someone else won.
                Ok(ownership) if lease.is_unconfirmed() => {
                    if ownership == Ownership::Ours {
                        tracing::debug!(
                            target: "distlock::release",
                            "released a lock that an unanswered acquire had taken"
                        );
                    }
                    return Ok(Released::Released);
                }
                // Gone because the backend's shutdown, racing this release, released it first.
                Ok(Ownership::Gone) if lease.lost_reason() == Some(LostReason::ShutDown) => {
                    return Ok(Released::Released)
                }
                Ok(found) => return Ok(settled(backend, lease, found, reply_lost)),
                Err(failure) if attempt < MAX_FAILED_ATTEMPTS => reply_lost |= failure.ambiguous,
                Err(failure) => return Err(backend.backend_error(Operation::Release, failure)),
            }
        }
    }
    .instrument(span)
    .await
}

/// Releases `lease`'s key if its own token or `successor`'s holds it (a transfer to it may have
/// run): a transfer call with no TTL, which transfers nothing (`release.lua`'s
/// `<owner> <successor> 0`). What it found is the lock's, whichever token held it.
async fn release_either(
    backend: &Backend,
    lease: &HeldLease,
    successor: &Owner,
) -> EngineResult<Ownership> {
    let either = Successor {
        owner: successor.clone(),
        ttl: Duration::ZERO,
        ahead_of_waiter: false,
    };
    let transfer = backend
        .inner
        .engine
        .transfer(&lease.key, &lease.owner, &either);
    Ok(match transfer.await? {
        Transfer::Released(found) => found,
        // Nothing is transferred with no TTL; answered so anyway, the key was ours.
        Transfer::Granted { .. } | Transfer::Queued { .. } => Ownership::Ours,
    })
}

/// What a release of `lease` that found `found` reports, counted in the stats and metrics.
/// `reply_lost`: an earlier request of this release may have run, so "gone" means released.
fn settled(backend: &Backend, lease: &HeldLease, found: Ownership, reply_lost: bool) -> Released {
    let stats = &backend.inner.stats;
    let released = match found {
        Ownership::Ours => Released::Released,
        Ownership::Gone if reply_lost => {
            tracing::debug!(target: "distlock::release", "released; an earlier reply was lost");
            Released::Released
        }
        Ownership::Gone => {
            tracing::warn!(
                target: "distlock::release",
                key = %lease.key,
                "the lock had expired before it was released; the work after its expiry was unprotected"
            );
            Released::Expired
        }
        Ownership::TakenOver => {
            tracing::warn!(
                target: "distlock::release",
                key = %lease.key,
                "another owner holds the lock now; left it untouched"
            );
            Released::TakenOver
        }
    };
    Stats::bump(match released {
        Released::Released => &stats.released,
        Released::Expired => &stats.release_found_expired,
        Released::TakenOver => &stats.release_taken_over,
    });
    metrics::released(&lease.labels, released.label());
    released
}
