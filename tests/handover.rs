//! Handovers against real Redis: a waited-on lock's release grants it to the lock's next waiter
//! in the same script, and the waiter runs from that one message — no acquire after the
//! release. Two backends on one server stand for two processes. The next waiter's place and a
//! handed-over lock each last a short grant time (`policy::handover_grant`, 300 ms by default)
//! unless confirmed, so a waiter that left or vanished costs at most that.

mod common;

use common::{Fixture, SingleRedis, PREFIX};
use distlock::__private::raw;
use distlock::{Backend, BackendBuilder, Lease, Lock, LockError, LockGuard, Released};
use distlock_test_support::{wait_until, ChannelListener, FaultProxy, RedisServer, Reply, Wake};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// A lease far longer than anything here: only a handover's grant time can end one early.
const LONG: Duration = Duration::from_secs(10);

/// The server's entry for `key`'s first queued waiter, if any: the one a release hands it to.
fn next_waiter(server: &RedisServer, key: &str) -> Option<String> {
    common::first_queued(server, key)
}

/// Waits (at most 5 s) until the server names a next waiter of `key` whose record ends with
/// `label`, or names none when `label` is `None`.
async fn until_next_waiter(server: &RedisServer, key: &str, label: Option<&str>) {
    let mut seen = None;
    let reached = server
        .wait_until(Duration::from_secs(5), async || {
            seen = next_waiter(server, key);
            match label {
                Some(label) => seen.as_deref().is_some_and(|next| next.ends_with(label)),
                None => seen.is_none(),
            }
        })
        .await;
    assert!(reached, "{key}'s next waiter is {seen:?}, never {label:?}");
}

/// A waiting task: when it got the lock, and its guard.
type Waiter = JoinHandle<Result<(Instant, LockGuard), LockError>>;

/// A task of `backend` that waits (up to 10 s) for `key` with a long fixed lease.
fn spawn_long_waiter(backend: &Backend, key: &'static str) -> Waiter {
    let backend = backend.clone();
    tokio::spawn(async move {
        let lock = Lock::new(key).on(&backend).lease(Lease::Fixed(LONG));
        let guard = lock.wait(LONG).acquire().await?;
        Ok((Instant::now(), guard))
    })
}

fn labelled(server: &RedisServer, label: &str) -> Backend {
    Backend::builder(server.url())
        .prefix(PREFIX)
        .holder_label(label)
        .build()
        .unwrap()
}

/// Holds "handed" on `holder` with a long fixed lease, lets a task of `waiting` wait for it until
/// it waits for the release's message (asked, subscribed, asked again; no early retry can race
/// the release: a release while a request is in flight makes that reply "yours", with no
/// handover to count), then releases it. Returns the waiter's guard and the released token.
async fn release_to_a_waiter(holder: &Backend, waiting: &Backend) -> (LockGuard, u64) {
    raw::set_backoff_floor(waiting, LONG);
    let held = Lock::new("handed")
        .on(holder)
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_long_waiter(waiting, "handed");
    let asked_twice = raw::until_local(LONG, async || waiting.stats().busy_replies >= 2).await;
    assert!(asked_twice, "{:?}", waiting.stats());
    let released_token = held.fencing_token();
    assert_eq!(held.release().await.unwrap(), Released::Released);
    (waiter.await.unwrap().unwrap().1, released_token)
}

/// The handed-over lock is the waiter's on the server: its token and its holder label (which
/// the server took from the next waiter's record).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_hands_the_lock_to_its_next_waiter() {
    let fx = SingleRedis::start(|b| b);
    let waiting = labelled(&fx.server, "waiting-process");
    let (guard, released_token) = release_to_a_waiter(fx.backend(), &waiting).await;
    assert_eq!(waiting.stats().handed_over, 1, "{:?}", waiting.stats());
    assert!(guard.fencing_token() > released_token);
    let holder = fx.backend().inspect("handed").await.unwrap().unwrap();
    assert_eq!(holder.fencing_token, guard.fencing_token());
    assert_eq!(holder.label.as_deref(), Some("waiting-process"));
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

/// Tokens stay above the last one issued when the server clock is behind it (a clock stepped
/// back): an acquire and a handover each issue the last token + 1, not the clock.
/// A handover is announced on the waiting process's own channel, not on the key's: a process
/// that watches the key (for any other waiter of it) reads nothing of handovers to others. The
/// waiter is handed the lock by that message (asking again would count as acquired, not as
/// handed over), and no other process of the key's has a handover channel to be read on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_is_announced_to_the_waiters_process_alone() {
    let fx = SingleRedis::start(|b| b);
    let waiting = labelled(&fx.server, "waiting-process");
    let key_channel = format!("{PREFIX}:{{handed}}:released");
    let mut watching_the_key = ChannelListener::listen(fx.server.addr(), &key_channel, LONG);
    let (guard, _) = release_to_a_waiter(fx.backend(), &waiting).await;
    assert_eq!(waiting.stats().handed_over, 1, "{:?}", waiting.stats());
    assert_eq!(waiting.stats().busy_replies, 2, "{:?}", waiting.stats());
    let on_the_key: Vec<String> = watching_the_key
        .messages()
        .iter()
        .map(|message| String::from_utf8_lossy(message).into_owned())
        .collect();
    assert_eq!(
        on_the_key,
        Vec::<String>::new(),
        "announced on {key_channel}"
    );
    let pattern = format!("{PREFIX}:handover:*");
    let channels = fx.server.command(&["PUBSUB", "CHANNELS", &pattern]);
    assert_eq!(
        channels.as_array().map(<[Reply]>::len),
        Some(1),
        "only the waiting process listens for handovers: {channels:?}"
    );
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_follow_a_marker_ahead_of_the_clock_by_acquire_and_by_handover() {
    // Centuries ahead of today's µs clock, still exact as a Lua double (below 2^53).
    const AHEAD: u64 = 9_000_000_000_000_000;
    let fx = SingleRedis::start(|b| b);
    let marker = format!("F{AHEAD}");
    fx.server.command(&[
        "SET",
        &SingleRedis::lock_key("handed"),
        &marker,
        "PX",
        "60000",
    ]);
    let waiting = labelled(&fx.server, "waiting-process");
    let (guard, released_token) = release_to_a_waiter(fx.backend(), &waiting).await;
    assert_eq!(released_token, AHEAD + 1, "the acquire's token");
    assert_eq!(waiting.stats().handed_over, 1, "{:?}", waiting.stats());
    assert_eq!(guard.fencing_token(), AHEAD + 2, "the handover's token");
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

/// A waiting call that ends (cancelled here) gives its place up in the background: the release
/// that follows frees the lock instead of handing it to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_next_waiter_gives_its_place_up() {
    let fx = SingleRedis::start(|b| b);
    let waiting = labelled(&fx.server, "leaving-process");
    let holder = Lock::new("left")
        .on(fx.backend())
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let waiter = {
        let waiting = waiting.clone();
        tokio::spawn(async move { Lock::new("left").on(&waiting).wait(LONG).acquire().await })
    };
    until_next_waiter(&fx.server, "left", Some("leaving-process")).await;
    waiter.abort();
    until_next_waiter(&fx.server, "left", None).await;
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    assert_eq!(fx.backend().inspect("left").await.unwrap(), None);
    assert_eq!(waiting.stats().handed_over, 0);
}

/// Holds `key` on the fixture's backend with a long fixed lease, and makes a task of a backend
/// that reaches the server through a proxy (`vanishing-process`, cut off by blackholing the
/// proxy) its next waiter. Returns the proxy, the holder and the waiting task.
async fn held_with_a_next_waiter_behind_a_proxy(
    fx: &SingleRedis,
    key: &'static str,
) -> (FaultProxy, LockGuard, Waiter) {
    let proxy = FaultProxy::start(fx.server.addr()).await;
    let vanishing = Backend::builder(proxy.url())
        .prefix(PREFIX)
        .holder_label("vanishing-process")
        .build()
        .unwrap();
    let holder = Lock::new(key)
        .on(fx.backend())
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_long_waiter(&vanishing, key);
    until_next_waiter(&fx.server, key, Some("vanishing-process")).await;
    (proxy, holder, waiter)
}

/// A next waiter that vanishes (its process cut off from the server) after the lock was handed
/// to it never confirms it: the handed-over lock expires within the grant time and another
/// waiter takes it. The vanished waiter, back, does not trust the late handover: it acquires
/// only after the other one released, with a larger token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_to_a_vanished_waiter_expires_and_the_lock_moves_on() {
    let fx = SingleRedis::start(|b| b);
    let (proxy, holder, vanished) = held_with_a_next_waiter_behind_a_proxy(&fx, "moved").await;
    let other = labelled(&fx.server, "other-process");
    let second = spawn_long_waiter(&other, "moved");
    // Queued behind the next waiter: the handed-over lock stays marked as waited on.
    let queued = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            common::queued(&fx.server, &SingleRedis::lock_key("moved")).len() == 2
        })
        .await;
    assert!(queued, "the other process's waiter never queued");
    proxy.blackhole(true);
    let released_at = Instant::now();
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    let handed = fx.backend().inspect("moved").await.unwrap().unwrap();
    assert_eq!(handed.label.as_deref(), Some("vanishing-process"));
    assert!(handed.ttl <= Duration::from_millis(300), "{handed:?}");

    let (taken_at, guard) = second.await.unwrap().unwrap();
    assert!(
        taken_at - released_at >= Duration::from_millis(250),
        "taken {:?} after the handover, before its grant ran out",
        taken_at - released_at
    );
    assert!(guard.fencing_token() > handed.fencing_token);
    assert_eq!(other.stats().handed_over, 0);

    proxy.blackhole(false);
    let second_token = guard.fencing_token();
    let released_again = Instant::now();
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    let (back_at, back) = vanished.await.unwrap().unwrap();
    assert!(back_at >= released_again, "held while the other waiter did");
    assert!(back.fencing_token() > second_token);
    back.release().await.unwrap();
}

/// A waiter whose lost reply may have queued it anew confirms a late handover message by asking:
/// it does not take it as a grant counted from the retry's send time. Found by the model
/// checker (tests/model): a waiter quiet past the grant time of a handover to it (here, a reply
/// held back 700 ms), whose next request was queued anew and lost its reply, heard "queued,
/// the place kept" from the retry; the lapsed handover's message, late (held back 900 ms), then
/// made it a holder beside the process that took the lock after the lapse.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_handover_after_a_lost_reply_is_confirmed_by_asking() {
    let fx = SingleRedis::start(|b| b);
    let (waiting, other) = (
        labelled(&fx.server, "waiting-process"),
        labelled(&fx.server, "other-process"),
    );
    let holder = Lock::new("late")
        .on(fx.backend())
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let mut late = spawn_long_waiter(&waiting, "late");
    // Asked, subscribed, asked again: the handover's message will reach it.
    let asked_twice = raw::until_local(LONG, async || waiting.stats().busy_replies >= 2).await;
    assert!(asked_twice, "{:?}", waiting.stats());
    let second = spawn_long_waiter(&other, "late");
    let queued = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            common::queued(&fx.server, &SingleRedis::lock_key("late")).len() == 2
        })
        .await;
    assert!(queued, "the other process's waiter never queued");

    // The waiter's next reply is held back past the grant time; then the lock is handed to it.
    raw::set_acquire_reply_delay(&waiting, Duration::from_millis(700));
    let held = raw::until_local(LONG, async || raw::acquire_replies_held(&waiting) >= 1).await;
    assert!(held, "the waiter never asked again");
    raw::set_handover_message_delay(&waiting, Duration::from_millis(900));
    raw::lose_next_anew_reply(&waiting);
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    raw::set_acquire_reply_delay(&waiting, Duration::ZERO);
    let (_, guard) = second.await.unwrap().unwrap();
    let lost = raw::until_local(LONG, async || !raw::anew_reply_still_to_lose(&waiting)).await;
    assert!(lost, "the waiter was never queued anew");

    // The late message comes about 200 ms after that: the waiter must not hold beside `guard`.
    let early = tokio::time::timeout(Duration::from_millis(800), &mut late).await;
    if let Ok(Ok(Ok((_, beside)))) = &early {
        panic!(
            "the waiter holds with token {} beside the other process's {}",
            beside.fencing_token(),
            guard.fencing_token()
        );
    }
    assert!(early.is_err(), "the waiter ended early: {early:?}");
    let (token, released_at) = (guard.fencing_token(), Instant::now());
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    let (back_at, back) = late.await.unwrap().unwrap();
    assert!(back_at >= released_at, "held while the other process did");
    assert!(back.fencing_token() > token);
    assert_eq!(waiting.stats().handed_over, 0, "{:?}", waiting.stats());
    back.release().await.unwrap();
}

/// A next waiter that stops asking (its process cut off from the server while it waits) loses its
/// place when its grant time runs out: the release frees the lock, as for any waited-on lock,
/// instead of handing it to nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_next_waiter_that_stopped_asking_is_not_handed_the_lock() {
    let fx = SingleRedis::start(|b| b);
    let (proxy, holder, vanished) = held_with_a_next_waiter_behind_a_proxy(&fx, "stopped").await;
    proxy.blackhole(true);
    // Its place expires by itself: woken by the expiry, not by a command.
    let gone = wait_until(
        &[&fx.server],
        Wake::CommandsAndExpiries,
        Duration::from_secs(5),
        async || next_waiter(&fx.server, "stopped").is_none(),
    )
    .await;
    assert!(gone, "the vanished waiter's place never ran out");
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    assert_eq!(
        fx.backend().inspect("stopped").await.unwrap(),
        None,
        "the lock went to a waiter that had stopped asking"
    );
    vanished.abort();
    proxy.blackhole(false);
}

/// A key's subscription travels with its local turn: the next local task does not subscribe
/// again. Its request that makes it the next waiter is answered on the command connection, and
/// the handover's message comes on the notification connection — it can come first (here: the
/// reply is held back 100 ms). The message is kept for the task all the same: it runs from it,
/// with no retry (it would wait out its 10 s backoff floor otherwise).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_message_that_overtakes_its_reply_is_kept() {
    let fx = SingleRedis::start(|b| b);
    let waiting = labelled(&fx.server, "waiting-process");
    raw::set_backoff_floor(&waiting, LONG);
    let holder = Lock::new("overtaken")
        .on(fx.backend())
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let first = spawn_long_waiter(&waiting, "overtaken");
    let asked_twice = raw::until_local(LONG, async || waiting.stats().busy_replies >= 2).await;
    assert!(asked_twice, "{:?}", waiting.stats());
    let recorded = next_waiter(&fx.server, "overtaken").expect("the first task is next");
    let second = spawn_long_waiter(&waiting, "overtaken");
    let queued = raw::until_local(LONG, async || raw::local_waiters(&waiting) == 1).await;
    assert!(queued, "the second task never queued behind the first");

    // The first task leaves; the second takes its turn (and subscription) and is made the next
    // waiter, its reply held back.
    raw::set_acquire_reply_delay(&waiting, Duration::from_millis(100));
    first.abort();
    let mut seen = None;
    let replaced = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            seen = next_waiter(&fx.server, "overtaken");
            seen.as_ref().is_some_and(|next| *next != recorded)
        })
        .await;
    assert!(
        replaced,
        "the next waiter is {seen:?}, still the first task's"
    );
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    let started = Instant::now();
    let (_, guard) = second.await.unwrap().unwrap();
    let stats = waiting.stats();
    assert_eq!(stats.handed_over, 1, "{stats:?}");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "ran after {:?}, not from the message",
        started.elapsed()
    );
    raw::set_acquire_reply_delay(&waiting, Duration::ZERO);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

/// On every engine a lock another process waits for goes to it at the release: handed over in
/// the release's message where the handover is on (one server, Sentinel, Cluster), confirmed to
/// the waiter's own TTL; by the notification and an acquire where it is off (replica
/// acknowledgement, whose `WAIT` cannot cover a grant written by a release; Redlock, whose
/// masters could hand it to different waiters; the in-process engine, whose waiters are local
/// turns).
async fn the_waiting_process_gets_the_lock_at_the_release<F: Fixture>(
    configure: impl FnOnce(BackendBuilder) -> BackendBuilder,
    handed_over: bool,
) {
    let fx = F::start(configure);
    let waiting = fx.contender();
    let (guard, released_token) = release_to_a_waiter(fx.backend(), &waiting).await;
    let stats = waiting.stats();
    assert_eq!(
        (stats.acquired, stats.handed_over),
        (1, u64::from(handed_over)),
        "{stats:?}"
    );
    assert!(guard.fencing_token() > released_token);
    // Confirmed by the watchdog: the waiter's own 10 s, not the 300 ms grant.
    let confirmed = common::until(&fx, Duration::from_secs(5), async || {
        fx.pttl("handed")
            .await
            .is_some_and(|ttl| ttl > Duration::from_secs(1))
    })
    .await;
    assert!(confirmed, "PTTL {:?}", fx.pttl("handed").await);
    assert_eq!(guard.release().await.unwrap(), Released::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_redis() {
    the_waiting_process_gets_the_lock_at_the_release::<SingleRedis>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_valkey() {
    the_waiting_process_gets_the_lock_at_the_release::<common::Valkey>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_sentinel() {
    let no_ack = |b: BackendBuilder| b.min_replicas(0);
    the_waiting_process_gets_the_lock_at_the_release::<common::Sentinel>(no_ack, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_sentinel_with_replica_ack() {
    the_waiting_process_gets_the_lock_at_the_release::<common::Sentinel>(|b| b, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_cluster() {
    the_waiting_process_gets_the_lock_at_the_release::<common::Cluster>(|b| b, true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_redlock() {
    the_waiting_process_gets_the_lock_at_the_release::<common::Redlock>(|b| b, false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_waiting_process_gets_the_lock_at_the_release_in_process() {
    the_waiting_process_gets_the_lock_at_the_release::<common::InProcess>(|b| b, false).await;
}

/// The queue of processes waiting for one key is bounded (`queue.lua`'s `QUEUE_BOUND`, 1,024):
/// one waiter more is told the lock is busy without a place (it hears of the release by
/// notification and asks again), and the lock is marked so that its releases announce
/// themselves. Each waiter's entry leaves with it, and once the last has left nothing of the
/// queue is on the server. The memory of a full queue is printed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_bounded_and_nothing_is_left_once_its_waiters_leave() {
    const BOUND: usize = 1024;
    // Places last 3 × max_backoff (at most the TTL): long enough to fill the queue in.
    let fx = SingleRedis::start(|b| b.max_backoff(LONG));
    let lock = SingleRedis::lock_key("crowded");
    let holder = Lock::new("crowded")
        .on(fx.backend())
        .lease(Lease::Fixed(LONG))
        .acquire()
        .await
        .unwrap();
    let tokens: Vec<String> = (0..=BOUND).map(|_| raw::new_owner()).collect();
    for token in &tokens[..BOUND] {
        let asked = raw::wait_with(fx.backend(), "crowded", token, LONG).await;
        assert_eq!(asked.unwrap(), Err(true), "queued");
    }
    let one_more = raw::wait_with(fx.backend(), "crowded", &tokens[BOUND], LONG).await;
    assert_eq!(one_more.unwrap(), Err(false), "no room in a full queue");
    assert_eq!(common::queued(&fx.server, &lock).len(), BOUND);
    let waited_on = fx.backend().inspect("crowded").await.unwrap().unwrap();
    assert!(waited_on.waited_on);
    assert!(fx
        .server
        .command(&["GET", &lock])
        .as_str()
        .unwrap()
        .starts_with('W'));
    let queue = format!("{lock}:queue");
    let mut bytes = fx
        .server
        .command(&["MEMORY", "USAGE", &queue])
        .as_int()
        .unwrap();
    for token in &tokens[..BOUND] {
        let entry = format!("{queue}:{token}");
        bytes += fx
            .server
            .command(&["MEMORY", "USAGE", &entry])
            .as_int()
            .unwrap();
    }
    eprintln!("QUEUE {BOUND} waiters on one key: {bytes} bytes on the server");
    assert!(bytes < 512 * 1024, "{bytes} bytes for a full queue");

    // Released: handed to the first waiter; each waiter released in turn hands it to the next.
    assert_eq!(holder.release().await.unwrap(), Released::Released);
    let first = fx.backend().inspect("crowded").await.unwrap().unwrap();
    assert_eq!(first.owner, tokens[0]);
    for token in &tokens {
        raw::release(fx.backend(), "crowded", token).await.unwrap();
    }
    let left = fx.server.command(&["KEYS", &format!("{queue}*")]);
    assert_eq!(left.as_array().map(<[Reply]>::len), Some(0), "{left:?}");
    assert_eq!(fx.backend().inspect("crowded").await.unwrap(), None);
}
