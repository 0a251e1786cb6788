//! The surface `#[distributed_lock]` expands to. Not a public API: it changes with the macro,
//! which is pinned to this exact crate version.

pub use crate::lock::context::checkpoint;
pub use crate::lock::key::KeyBuilder;
pub use crate::{Lease, LockError, LockKind, OnLost, Wait};
pub use core::time::Duration;

use crate::Lock;
use std::future::Future;

/// Const-constructible description of one annotated function's lock.
#[derive(Debug)]
pub struct Spec {
    pub backend: &'static str,
    pub wait: Wait,
    pub lease: Lease,
    pub on_lost: OnLost,
    pub max_hold: Option<Duration>,
    /// The key template as written (`keys = [..]`: the templates joined with `,`), the `lock`
    /// label of the metrics.
    pub template: &'static str,
    /// `mode = "read"` / `"write"` (the default) or `permits = N`.
    pub kind: crate::LockKind,
}

/// Acquires every key (all or none, canonical order), runs `body` under the call context with the
/// spec's lost-lease policy, and releases. Lock errors come back through `E: From<LockError>`.
///
/// # Cancel safety
/// Cancel safe for the lock, as [`Lock::run`](crate::Lock::run); the work is only as cancel
/// safe as `body`.
pub async fn locked<T, E, F>(spec: &'static Spec, keys: Vec<String>, body: F) -> Result<T, E>
where
    F: Future<Output = Result<T, E>>,
    E: From<LockError>,
{
    let mut lock = Lock::keys(keys)
        .template(spec.template)
        .kind(spec.kind)
        .backend(spec.backend)
        .wait_policy(spec.wait)
        .lease(spec.lease)
        .on_lost(spec.on_lost);
    if let Some(max_hold) = spec.max_hold {
        lock = lock.max_hold(max_hold);
    }
    match lock.run(body).await {
        Ok(result) => result,
        Err(err) => Err(E::from(err)),
    }
}

/// Generated code calls this so that a missing `From<LockError>` is reported at the error type.
pub fn assert_from_lock_error<E: From<LockError>>() {}

/// Raw store operations with caller-chosen owner tokens, and the knobs and counters distlock's
/// own test suite reads. Compiled only under `cfg(distlock_test_hooks)` (runtime/build.rs): no build of an
/// application has an API that takes a caller-chosen owner token.
#[cfg(distlock_test_hooks)]
pub mod raw {
    use crate::backend::Backend;
    use crate::engines::engine::{Acquired, Asker, Ownership, Renewal};
    use crate::error::Operation;
    use crate::hooks::Probe;
    use crate::lock::kind::LockKind;
    use crate::lock::owner::Owner;
    use crate::LockError;
    use std::time::Duration;

    /// The outcome of a raw operation: `1` ours, `0` gone, `-1` taken over (as the scripts answer).
    fn code(ownership: Ownership) -> i8 {
        match ownership {
            Ownership::Ours => 1,
            Ownership::Gone => 0,
            Ownership::TakenOver => -1,
        }
    }

    pub use crate::engines::in_process::twin::{
        lua_source, HolderReply, Mutation, Stored, StoredValue, Twin,
    };

    /// The client's rules as the runtime applies them, for the model checker (`tests/model`),
    /// which runs these functions rather than copies of them.
    pub mod rules {
        use crate::lock::kind::LockKind;
        use std::time::Duration;

        /// How long a lease of `ttl` is relied on from the request's send time
        /// (`lock/policy.rs`: `valid_for`).
        pub fn valid_for(ttl: Duration, drift_factor: f64) -> Duration {
            crate::lock::policy::valid_for(ttl, drift_factor)
        }

        /// The default clock drift factor (`BackendBuilder::clock_drift_factor`).
        pub const DRIFT_FACTOR: f64 = crate::backend::builder::DEFAULT_DRIFT_FACTOR;

        /// How long a queued waiter waits before it asks again unless woken
        /// (`lock/acquire.rs`: `keep_place`).
        pub fn keep_place(
            grant: Duration,
            holder_ttl: Option<Duration>,
            remaining: Option<Duration>,
        ) -> Duration {
            crate::lock::acquire::keep_place(grant, holder_ttl, remaining)
        }

        /// A handover is taken as it comes only with this much of its grant time left
        /// (`lock/acquire.rs`: `HANDOVER_MARGIN`).
        pub const HANDOVER_MARGIN: Duration = crate::lock::acquire::HANDOVER_MARGIN;

        /// How long a waiting writer's intent holds new readers back, and how often it is
        /// renewed (`lock/kind.rs`).
        pub const WRITER_INTENT: Duration = crate::lock::kind::WRITER_INTENT;
        pub const WRITER_RETRY: Duration = crate::lock::kind::WRITER_RETRY;

        /// Whether the entry at `place` of a queue whose entries ask for `kinds` (oldest first;
        /// `None`: a kind this version does not know) holds the lock (`engines/queue/order.rs`:
        /// `holds`).
        pub fn queue_holds(kinds: &[Option<LockKind>], place: usize) -> bool {
            let entries: Vec<_> = kinds
                .iter()
                .enumerate()
                .map(|(at, kind)| crate::engines::queue::order::Entry {
                    owner: at.to_string(),
                    token: at as u64,
                    lease: (),
                    kind: *kind,
                    label: String::new(),
                })
                .collect();
            crate::engines::queue::order::holds(&entries, place)
        }
    }

    /// A fresh random owner token.
    pub fn new_owner() -> String {
        Owner::random().as_str().to_owned()
    }

    fn owner(token: &str) -> Owner {
        Owner::from_raw(token)
    }

    /// Acquire with an explicit owner token: `Ok(Some(fence))` or `Ok(None)` when busy.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the request was sent, the lock may be taken under `token`
    /// all the same; nothing here releases it: the caller, who chose the token, releases with
    /// it, or it expires after `ttl`.
    pub async fn acquire(
        backend: &Backend,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Option<u64>, LockError> {
        match backend
            .inner
            .engine
            .acquire(key, &owner(token), ttl, Asker::Once, LockKind::Exclusive)
            .await
        {
            Ok(Acquired::Yes { fence }) => Ok(Some(fence)),
            Ok(Acquired::Busy { .. }) => Ok(None),
            Ok(Acquired::Unreplicated {
                acknowledged,
                wanted,
                timeout,
            }) => Err(LockError::ReplicasNotAcknowledged {
                key: key.to_owned(),
                acknowledged,
                wanted,
                timeout,
            }),
            Err(failure) => Err(backend.backend_error(Operation::Acquire, failure)),
        }
    }

    /// Ask for the lock as a waiter with an explicit owner token, as a waiting process does
    /// after its first try: `Ok(Ok(fence))` when granted; `Ok(Err(queued))` when busy, `queued`
    /// telling whether the server queued the token for it (or had no room).
    ///
    /// # Cancel safety
    /// Not cancel safe, as [`acquire`]: the caller, who chose the token, releases with it (which
    /// also takes it out of the queue), or its place lapses after the grant time.
    pub async fn wait_with(
        backend: &Backend,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Result<u64, bool>, LockError> {
        match backend
            .inner
            .engine
            .acquire(key, &owner(token), ttl, Asker::Waiting, LockKind::Exclusive)
            .await
        {
            Ok(Acquired::Yes { fence }) => Ok(Ok(fence)),
            Ok(Acquired::Busy { next, .. }) => Ok(Err(next.is_some())),
            Ok(other) => panic!("unexpected answer {other:?}"),
            Err(failure) => Err(backend.backend_error(Operation::Acquire, failure)),
        }
    }

    /// Release with an explicit owner token.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the request was sent, the release may still run on the
    /// server, as with a lost reply.
    pub async fn release(backend: &Backend, key: &str, token: &str) -> Result<i8, LockError> {
        backend
            .inner
            .engine
            .release(
                key,
                &owner(token),
                LockKind::Exclusive,
                crate::engines::engine::GrantedAs::Unknown,
            )
            .await
            .map(code)
            .map_err(|failure| backend.backend_error(Operation::Release, failure))
    }

    /// Renew with an explicit owner token.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the request was sent, the renewal may still extend the lock
    /// on the server, as with a lost reply.
    pub async fn renew(
        backend: &Backend,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<i8, LockError> {
        let owner = owner(token);
        let batch = [Renewal {
            key,
            owner: &owner,
            ttl,
            kind: LockKind::Exclusive,
        }];
        backend
            .inner
            .engine
            .renew(&batch)
            .await
            .map(|answers| answers[0].map_or(0, code))
            .map_err(|failure| backend.backend_error(Operation::Renew, failure))
    }

    /// A second client of `backend`'s engine (the same Redis connection or in-process map) with
    /// its own local queues, watchdog and stats: a contender the server, not the local queue,
    /// must refuse.
    pub fn another_client(backend: &Backend) -> Backend {
        backend.another_client()
    }

    /// Leases the backend's watchdog currently tracks.
    pub fn watched_leases(backend: &Backend) -> usize {
        backend.inner.watchdog.registered()
    }

    /// Times a registration woke the backend's watchdog task.
    pub fn watchdog_woken(backend: &Backend) -> u64 {
        backend.inner.watchdog.woken()
    }

    /// Whether the backend's watchdog task runs and its last look found no lease.
    pub fn watchdog_idle(backend: &Backend) -> bool {
        backend.inner.watchdog.is_idle()
    }

    /// Tasks queued locally behind another task's turn, over all keys.
    pub fn local_waiters(backend: &Backend) -> usize {
        backend.inner.gates.queued()
    }

    /// Keys with a local turn out (held, contended or waited for by some task).
    pub fn local_keys(backend: &Backend) -> usize {
        backend.inner.gates.keys()
    }

    /// Release-notification channels with a local watcher.
    pub fn watched_channels(backend: &Backend) -> usize {
        backend.inner.hooks.probe(Probe::WatchedChannels) as usize
    }

    /// Renewal round trips the engine sent, where it groups renewals itself (Redis Cluster: one
    /// per master holding leases per period); 0 for the others.
    pub fn renewal_round_trips(backend: &Backend) -> u64 {
        backend.inner.hooks.probe(Probe::RenewalRoundTrips)
    }

    /// Sentinel `+switch-master` announcements the backend acted on (its connections, and its
    /// waiters' subscriptions, move to the new primary); 0 for other deployments.
    pub fn switches_seen(backend: &Backend) -> u64 {
        backend.inner.hooks.probe(Probe::SwitchesSeen)
    }

    /// Acquires and releases that went to the server in a batch (group commit) rather than on
    /// their own.
    pub fn batched_calls(backend: &Backend) -> u64 {
        backend.inner.hooks.probe(Probe::BatchedCalls)
    }

    /// SUBSCRIBEs that went to the server in a batch rather than on their own.
    pub fn batched_subscriptions(backend: &Backend) -> u64 {
        backend.inner.hooks.probe(Probe::BatchedSubscriptions)
    }

    /// Test hook: pause this long before acting on an acquire's reply — the window in which a
    /// handover's message overtakes the reply that queued the caller.
    pub fn set_acquire_reply_delay(backend: &Backend, delay: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.acquire_reply_delay = delay;
        });
    }

    /// Test hook: pause this long before acting on a local transfer's reply — the window in
    /// which the releasing call can be cancelled, or its successor leave, after the transfer ran.
    pub fn set_transfer_reply_delay(backend: &Backend, delay: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.transfer_reply_delay = delay;
        });
    }

    /// Test hook: treat the reply to each local transfer's first request as lost (the transfer
    /// ran), so that the release asks again.
    pub fn lose_first_transfer_replies(backend: &Backend) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.lose_first_transfer_reply = true;
        });
    }

    /// Test hook: treat the next acquire reply that says "queued anew" as lost (the request
    /// ran), so that the retry hears "queued, the place kept".
    pub fn lose_next_anew_reply(backend: &Backend) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.lose_anew_acquire_reply = true;
        });
    }

    /// How many acquire replies [`set_acquire_reply_delay`] has held back so far.
    pub fn acquire_replies_held(backend: &Backend) -> u32 {
        crate::hooks::read(&backend.inner.hooks).acquire_replies_held
    }

    /// Whether the reply [`lose_next_anew_reply`] asked to lose is still to come.
    pub fn anew_reply_still_to_lose(backend: &Backend) -> bool {
        crate::hooks::read(&backend.inner.hooks).lose_anew_acquire_reply
    }

    /// Test hook: act on handover messages of a Redis notification connection only this long
    /// after they came.
    pub fn set_handover_message_delay(backend: &Backend, delay: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.handover_message_delay = delay;
        });
    }

    /// Test hook: pause this long between a "busy" reply and the subscription to the key's
    /// release notifications — the window subscribe-before-check closes.
    pub fn set_subscribe_delay(backend: &Backend, delay: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| hooks.subscribe_delay = delay);
    }

    /// Test hook: pause this long between the server's SUBSCRIBE reply and the local
    /// confirmation — the window in which the notification connection can die unseen.
    pub fn set_confirm_delay(backend: &Backend, delay: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| hooks.confirm_delay = delay);
    }

    /// Test hook: Sentinel `+switch-master` announcements are ignored, as if the sentinel
    /// connection had missed them; a demoted primary's `READONLY` reply is then what makes the
    /// backend ask the sentinels again.
    pub fn ignore_switch_announcements(backend: &Backend) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.ignore_switch_announcements = true
        });
    }

    /// Test hook: how long the waiters a release notifies have the lock before anyone else.
    pub fn set_reservation_window(backend: &Backend, window: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| {
            hooks.reservation_window = window
        });
    }

    /// Test hook: waits until `check` holds, for at most `limit`, checking now and after every
    /// change of the local state the functions above report (local queues and turns, watched
    /// channels, stats counters, batched calls) — never on a timer. `false` if it never held.
    ///
    /// # Cancel safety
    /// As cancel safe as `check`. It holds nothing between checks: dropped, it stops checking;
    /// a check dropped mid-way is the caller's to answer for.
    pub async fn until_local(limit: Duration, check: impl AsyncFnMut() -> bool) -> bool {
        crate::hooks::local_changes::until(limit, check).await
    }

    /// Test hook: [`until_local`] for a thread outside any runtime (it blocks the thread).
    pub fn wait_local(limit: Duration, check: impl FnMut() -> bool) -> bool {
        crate::hooks::local_changes::wait(limit, check)
    }

    /// Test hook: make every backoff sleep at least `floor`, so a waiter that misses a release
    /// notification visibly waits (bounded by the holder's TTL and the wait budget).
    pub fn set_backoff_floor(backend: &Backend, floor: Duration) {
        crate::hooks::set(&backend.inner.hooks, |hooks| hooks.backoff_floor = floor);
    }
}
