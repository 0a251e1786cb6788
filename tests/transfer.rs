//! Local transfers against real servers: a release whose lock nobody else waits for grants it,
//! in the same script, to the task of the same process queued behind the holder — one script
//! per local transfer instead of a release and an acquire, and the turn passes with the lock. A
//! release that hands the lock to another process's waiter makes that task the next waiter
//! after it, in the same script, and the turn passes with that place.
//! Every way the transfer can be interrupted (the successor leaves, the releasing call is
//! cancelled, a reply is lost) leaves no lock held for longer than a round trip.

mod common;

use common::{command_calls, Fixture, SingleRedis};
use distlock::__private::raw;
use distlock::{Backend, BackendBuilder, Lease, Lock, LockError, LockGuard, Released};
use std::time::Duration;
use tokio::task::JoinHandle;

/// A lease far longer than anything here: a lock left behind would outlast every wait.
const LONG: Duration = Duration::from_secs(10);

/// Holds `key` on `backend` with a long fixed lease and queues a task of the same backend
/// behind it (returns once it is queued): the holder, and the queued task.
async fn held_with_a_local_waiter(backend: &Backend, key: &'static str) -> (LockGuard, Waiter) {
    let held = Lock::new(key)
        .on(backend)
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(backend, key);
    let queued = raw::until_local(LONG, async || raw::local_waiters(backend) == 1).await;
    assert!(queued, "the second task never queued behind the first");
    (held, waiter)
}

/// The fencing token the server holds `key` with, if it is held.
async fn token_on_server(backend: &Backend, key: &str) -> Option<u64> {
    let holder = backend.inspect(key).await.unwrap();
    holder.map(|holder| holder.fencing_token)
}

/// Waits (at most 5 s) until the server holds `key` with a token above `token`: a transfer
/// that ran.
async fn until_held_above(fx: &SingleRedis, key: &str, token: u64) {
    let reached = common::until(fx, Duration::from_secs(5), async || {
        token_on_server(fx.backend(), key)
            .await
            .is_some_and(|held| held > token)
    })
    .await;
    assert!(reached, "{key} was never held above {token}");
}

/// The released lock is the queued task's, with a larger token and that task's TTL; where the
/// engine transfers, without a request of the task's own.
async fn the_next_local_task_gets_the_lock_at_the_release<F: Fixture>(
    configure: impl FnOnce(BackendBuilder) -> BackendBuilder,
    transferred: bool,
) {
    let fx = F::start(configure);
    let (held, waiter) = held_with_a_local_waiter(fx.backend(), "local").await;
    let released_token = held.fencing_token();
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let guard = waiter.await.unwrap().unwrap();
    let stats = fx.backend().stats();
    assert_eq!(
        (stats.acquired, stats.transferred, stats.released),
        (2, u64::from(transferred), 1),
        "{stats:?}"
    );
    assert!(guard.fencing_token() > released_token);
    assert_eq!(
        token_on_server(fx.backend(), "local").await,
        Some(guard.fencing_token())
    );
    let ttl = fx.pttl("local").await.expect("held");
    assert!(ttl > LONG / 2, "the successor's own TTL, not {ttl:?}");
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(token_on_server(fx.backend(), "local").await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_redis() {
    the_next_local_task_gets_the_lock_at_the_release::<SingleRedis>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_valkey() {
    the_next_local_task_gets_the_lock_at_the_release::<common::Valkey>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_sentinel() {
    let no_ack = |b: BackendBuilder| b.min_replicas(0);
    the_next_local_task_gets_the_lock_at_the_release::<common::Sentinel>(no_ack, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_sentinel_with_replica_ack() {
    // A grant written by a release would not be acknowledged by the replicas.
    the_next_local_task_gets_the_lock_at_the_release::<common::Sentinel>(|b| b, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_cluster() {
    the_next_local_task_gets_the_lock_at_the_release::<common::Cluster>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_redlock() {
    // Each master would have to transfer alike; a quorum decides an acquire instead.
    the_next_local_task_gets_the_lock_at_the_release::<common::Redlock>(|b| b, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_next_local_task_gets_the_lock_at_the_release_in_process() {
    the_next_local_task_gets_the_lock_at_the_release::<common::InProcess>(|b| b, false).await;
}

/// A transfer is one script on the server — no acquire of the successor's, no notification —
/// and the lock keeps the process's holder label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transfer_is_one_script_and_announces_nothing() {
    let fx = SingleRedis::start(|b| b.holder_label("this-process"));
    let (held, waiter) = held_with_a_local_waiter(fx.backend(), "one").await;
    let (scripts, publishes) = (
        command_calls(&fx.server, "evalsha"),
        command_calls(&fx.server, "publish"),
    );
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(command_calls(&fx.server, "evalsha") - scripts, 1);
    assert_eq!(command_calls(&fx.server, "publish") - publishes, 0);
    let holder = fx.backend().inspect("one").await.unwrap().unwrap();
    assert_eq!(holder.label.as_deref(), Some("this-process"));
    assert!(!holder.waited_on);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

/// The entry of `key`'s first queued waiter (`queue.lua`: `<grant ms> <owner>[ <label>]`), if
/// any: the one a release hands the lock to.
fn next_waiter(fx: &SingleRedis, key: &str) -> Option<String> {
    common::first_queued(&fx.server, key)
}

/// The fixture's backend holds `key`, by a handover from another backend (another process),
/// so its turn carries the key's subscription, as it does while processes take turns. Then a
/// task of the other backend becomes the lock's next waiter, and a local task queues behind
/// the holder. Neither backend asks again on its own (backoff floors of 10 s): only a release's
/// message moves a waiter. Returns the holder, the other backend, its waiter and the local task.
async fn held_with_waiters_here_and_there(
    fx: &SingleRedis,
    key: &'static str,
) -> (LockGuard, Backend, Waiter, Waiter) {
    let other = fx.contender();
    raw::set_backoff_floor(&other, LONG);
    raw::set_backoff_floor(fx.backend(), LONG);
    let first = Lock::new(key)
        .on(&other)
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let holder = spawn_waiter(fx.backend(), key);
    let asked = raw::until_local(LONG, async || fx.backend().stats().busy_replies >= 2).await;
    assert!(asked, "{:?}", fx.backend().stats());
    assert_eq!(first.release().await.unwrap(), Released::Released);
    let held = holder.await.unwrap().unwrap();
    assert_eq!(fx.backend().stats().handed_over, 1);
    let other_waiter = spawn_waiter(&other, key);
    let asked = raw::until_local(LONG, async || other.stats().busy_replies >= 2).await;
    assert!(asked, "{:?}", other.stats());
    let local_waiter = spawn_waiter(fx.backend(), key);
    let queued = raw::until_local(LONG, async || raw::local_waiters(fx.backend()) == 1).await;
    assert!(queued, "the local task never queued behind the holder");
    (held, other, other_waiter, local_waiter)
}

type Waiter = JoinHandle<Result<LockGuard, LockError>>;

/// A task of `backend` that waits (up to 10 s) for `key` with a long fixed lease.
fn spawn_waiter(backend: &Backend, key: &'static str) -> Waiter {
    let backend = backend.clone();
    tokio::spawn(async move {
        let lock = Lock::new(key).on(&backend).lease(Lease::Fixed(LONG));
        lock.wait(LONG).acquire().await
    })
}

/// Releases the other process's guard, then waits (at most 5 s) for the local task, which must
/// get the lock next, with a larger token.
async fn after_the_other_process(other_guard: LockGuard, local_waiter: Waiter) -> LockGuard {
    let other_token = other_guard.fencing_token();
    assert_eq!(other_guard.release().await.unwrap(), Released::Released);
    let local_guard = tokio::time::timeout(Duration::from_secs(5), local_waiter)
        .await
        .expect("the local task never got the lock")
        .unwrap()
        .unwrap();
    assert!(local_guard.fencing_token() > other_token);
    local_guard
}

/// A lock another process waits for goes to that process (its next waiter) at the release, not
/// to the local task queued behind the holder: FIFO holds across processes. The same script
/// makes the local task the next waiter after it, so that task never asks: the other process's
/// release hands the lock back to it. Two handoffs across processes, two scripts in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_another_process_waits_for_goes_to_it_and_the_local_task_queues_behind() {
    let fx = SingleRedis::start(|b| b.holder_label("this-process").local_batch(Duration::ZERO));
    let (held, other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "fifo").await;
    let (scripts, publishes) = (
        command_calls(&fx.server, "evalsha"),
        command_calls(&fx.server, "publish"),
    );
    let asked = fx.backend().stats().busy_replies;
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert_eq!(other.stats().handed_over, 1, "{:?}", other.stats());
    assert!(
        !local_waiter.is_finished(),
        "the local task overtook the other process"
    );
    let next = next_waiter(&fx, "fifo").expect("the local task is the next waiter");
    assert!(next.ends_with(" this-process"), "{next}");
    let local_guard = after_the_other_process(other_guard, local_waiter).await;
    let stats = fx.backend().stats();
    assert_eq!(
        (
            stats.transferred,
            stats.handed_over,
            stats.busy_replies - asked
        ),
        (0, 2, 0),
        "the local task was handed the lock without asking: {stats:?}"
    );
    assert_eq!(command_calls(&fx.server, "evalsha") - scripts, 2);
    assert_eq!(command_calls(&fx.server, "publish") - publishes, 2);
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
    assert_eq!(token_on_server(fx.backend(), "fifo").await, None);
}

/// Within the backend's `local_batch`, a release goes on transferring the lock to the next local
/// task, ahead of the other process's next waiter, which keeps its place: one script, nothing
/// published. The last local holder's release then hands the lock to that waiter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn within_the_local_batch_the_local_task_goes_ahead_and_the_other_process_keeps_its_place() {
    let fx = SingleRedis::start(|b| b.local_batch(LONG));
    let (held, other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "batch").await;
    let waiting = next_waiter(&fx, "batch").expect("the other process's task is the next waiter");
    let (scripts, publishes) = (
        command_calls(&fx.server, "evalsha"),
        command_calls(&fx.server, "publish"),
    );
    let held_token = held.fencing_token();
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let local_guard = local_waiter.await.unwrap().unwrap();
    assert!(local_guard.fencing_token() > held_token);
    assert_eq!(fx.backend().stats().transferred, 1);
    assert_eq!(command_calls(&fx.server, "evalsha") - scripts, 1);
    assert_eq!(command_calls(&fx.server, "publish") - publishes, 0);
    assert!(
        !other_waiter.is_finished(),
        "the other process got the lock too"
    );
    let still = next_waiter(&fx, "batch").expect("the other process lost its place");
    assert_eq!(owner_of(&still), owner_of(&waiting));
    // Nobody queued locally: the release hands the lock over.
    let local_token = local_guard.fencing_token();
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert_eq!(other.stats().handed_over, 1, "{:?}", other.stats());
    assert!(other_guard.fencing_token() > local_token);
    assert_eq!(other_guard.release().await.unwrap(), Released::Released);
}

/// A local batch ends `local_batch` after the lock came to the process, however many tasks it
/// passed through: the transferred lock's release, past that time, hands the lock to the other
/// process's next waiter, and the next local task queues behind it. (Were the batch counted
/// from each transfer, a process with tasks always queued would keep the lock for good.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_batch_ends_its_time_after_the_lock_came_to_the_process() {
    const BATCH: Duration = Duration::from_secs(2);
    let fx = SingleRedis::start(|b| b.local_batch(BATCH));
    let began = std::time::Instant::now();
    let (held, other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "batch-ends").await;
    // The lock came to this process (by a handover) between `began` and now.
    let came = std::time::Instant::now();
    assert!(
        came - began < BATCH / 2,
        "setting up took most of the batch: {:?}",
        came - began
    );
    // A quarter into the batch (at most three quarters, counted from the handover): transferred.
    // The transferred lock is then three quarters of the batch younger than the batch.
    tokio::time::sleep_until((came + BATCH / 4).into()).await;
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let local_guard = local_waiter.await.unwrap().unwrap();
    assert_eq!(fx.backend().stats().transferred, 1);
    let second_local = spawn_waiter(fx.backend(), "batch-ends");
    let queued = raw::until_local(LONG, async || raw::local_waiters(fx.backend()) == 1).await;
    assert!(queued, "the second local task never queued");
    // The batch's time is what this test is about: it runs out while the lock is held.
    tokio::time::sleep_until((came + BATCH).into()).await;
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert_eq!(other.stats().handed_over, 1, "{:?}", other.stats());
    assert_eq!(
        fx.backend().stats().transferred,
        1,
        "transferred past the batch"
    );
    assert!(
        !second_local.is_finished(),
        "the local task overtook the other process"
    );
    let local_guard = after_the_other_process(other_guard, second_local).await;
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
    assert_eq!(token_on_server(fx.backend(), "batch-ends").await, None);
}

/// The owner token in a next waiter's record (`<grant ms> <owner>[ ...]`).
fn owner_of(record: &str) -> &str {
    record.split(' ').nth(1).unwrap_or_default()
}

/// A local task that leaves after the release made it the next waiter, before it takes that
/// place, gives the place up in the background: the other process's release then frees the
/// lock instead of handing it to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_left_before_taking_its_place_gives_it_up() {
    // A place that lasts 10 s (3 × max_backoff, at most the TTL): only giving it up ends it
    // within the test.
    let fx = SingleRedis::start(|b| {
        b.max_backoff(Duration::from_secs(5))
            .local_batch(Duration::ZERO)
    });
    raw::set_transfer_reply_delay(fx.backend(), Duration::from_secs(1));
    let (held, _other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "place").await;
    let release = tokio::spawn(held.release());
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert!(
        next_waiter(&fx, "place").is_some(),
        "the local task was not queued"
    );
    local_waiter.abort();
    assert!(local_waiter.await.unwrap_err().is_cancelled());
    assert!(
        !release.is_finished(),
        "the release's reply was acted on before the local task left"
    );
    assert_eq!(release.await.unwrap().unwrap(), Released::Released);
    let given_up = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            next_waiter(&fx, "place").is_none()
        })
        .await;
    assert!(given_up, "the place of a task that left was kept");
    assert_eq!(other_guard.release().await.unwrap(), Released::Released);
    assert_eq!(token_on_server(fx.backend(), "place").await, None);
}

/// A release that handed the lock over and queued the local task behind it, whose reply was
/// lost, is asked again: the retry finds the other process's lock with the local task's pledged
/// token as its next waiter — this release's doing, since that token is pledged to it alone — and
/// answers as the first one did. Reported released, not taken over; the local task keeps its
/// place and is handed the lock after the other process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_of_a_release_that_handed_the_lock_over_reports_it_released() {
    let fx = SingleRedis::start(|b| b.local_batch(Duration::ZERO));
    let (held, other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "lost-queue").await;
    raw::lose_first_transfer_replies(fx.backend());
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert_eq!(other.stats().handed_over, 1, "{:?}", other.stats());
    let local_guard = after_the_other_process(other_guard, local_waiter).await;
    let stats = fx.backend().stats();
    assert_eq!(
        (
            stats.release_taken_over,
            stats.release_found_expired,
            stats.handed_over
        ),
        (0, 0, 2),
        "{stats:?}"
    );
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
}

/// A successor that leaves after its transfer ran, before it takes the lock, leaves no lock
/// held: the lock it never took is released in the background.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_successor_that_left_before_taking_its_transfer_leaves_no_lock() {
    let fx = SingleRedis::start(|b| b);
    raw::set_transfer_reply_delay(fx.backend(), Duration::from_secs(1));
    let (held, waiter) = held_with_a_local_waiter(fx.backend(), "left").await;
    let released_token = held.fencing_token();
    let release = tokio::spawn(held.release());
    until_held_above(&fx, "left", released_token).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    assert!(
        !release.is_finished(),
        "the transfer's reply was acted on before the successor left"
    );
    assert_eq!(release.await.unwrap().unwrap(), Released::Released);
    let freed = common::until(&fx, Duration::from_secs(5), async || {
        token_on_server(fx.backend(), "left").await.is_none()
    })
    .await;
    assert!(freed, "the transferred lock was left held");
    assert_eq!(fx.backend().stats().transferred, 0);
}

/// A release cancelled after its transfer ran leaves no lock held either: the transferred lock
/// is released in the background, and the successor takes the lock by asking, with a new owner
/// token — long before the 10 s the transferred lock would have lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_mid_transfer_leaves_the_successor_to_ask() {
    let fx = SingleRedis::start(|b| b);
    raw::set_transfer_reply_delay(fx.backend(), Duration::from_secs(1));
    let (held, waiter) = held_with_a_local_waiter(fx.backend(), "cancelled").await;
    let released_token = held.fencing_token();
    let release = tokio::spawn(held.release());
    until_held_above(&fx, "cancelled", released_token).await;
    let transferred_token = token_on_server(fx.backend(), "cancelled").await.unwrap();
    release.abort();
    assert!(release.await.unwrap_err().is_cancelled());
    let guard = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the successor waited for the transferred lock to expire")
        .unwrap()
        .unwrap();
    let stats = fx.backend().stats();
    assert_eq!(
        (
            stats.transferred,
            stats.release_taken_over,
            stats.release_found_expired
        ),
        (0, 0, 0),
        "{stats:?}"
    );
    assert!(guard.fencing_token() > transferred_token);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(token_on_server(fx.backend(), "cancelled").await, None);
}

/// A release cancelled after its handover ran and queued the local task behind the other
/// process: the release finished in the background finds the other process's lock with the
/// local task's pledged token next — its own handover — and counts it released (not taken
/// over), giving that place up. The local task asks with a new token and gets the lock after
/// the other process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_cancelled_mid_handover_gives_the_queued_place_up() {
    let fx = SingleRedis::start(|b| b.local_batch(Duration::ZERO));
    let (held, _other, other_waiter, local_waiter) =
        held_with_waiters_here_and_there(&fx, "cancelled-queue").await;
    raw::set_transfer_reply_delay(fx.backend(), Duration::from_secs(1));
    let release = tokio::spawn(held.release());
    let other_guard = other_waiter.await.unwrap().unwrap();
    assert!(next_waiter(&fx, "cancelled-queue").is_some());
    release.abort();
    assert!(release.await.unwrap_err().is_cancelled());
    let finished = raw::until_local(LONG, async || fx.backend().stats().released == 1).await;
    assert!(finished, "the release was not finished in the background");
    raw::set_transfer_reply_delay(fx.backend(), Duration::ZERO);
    let local_guard = after_the_other_process(other_guard, local_waiter).await;
    let stats = fx.backend().stats();
    assert_eq!(
        (stats.release_taken_over, stats.release_found_expired),
        (0, 0),
        "{stats:?}"
    );
    assert_eq!(local_guard.release().await.unwrap(), Released::Released);
}

/// A transfer whose reply was lost is asked again, and the retry answers as the transfer did:
/// the lock is the successor's, and the release reports it released (not taken over).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_transfer_reply_is_answered_alike_when_asked_again() {
    let fx = SingleRedis::start(|b| b);
    raw::lose_first_transfer_replies(fx.backend());
    let (held, waiter) = held_with_a_local_waiter(fx.backend(), "lost").await;
    let scripts = command_calls(&fx.server, "evalsha");
    assert_eq!(held.release().await.unwrap(), Released::Released);
    let guard = waiter.await.unwrap().unwrap();
    assert_eq!(command_calls(&fx.server, "evalsha") - scripts, 2);
    let stats = fx.backend().stats();
    assert_eq!(
        (stats.transferred, stats.release_taken_over),
        (1, 0),
        "{stats:?}"
    );
    assert_eq!(
        token_on_server(fx.backend(), "lost").await,
        Some(guard.fencing_token())
    );
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}
