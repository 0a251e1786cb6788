//! Waiting against real Redis: release notifications, subscribe-before-check, the backoff safety
//! net, local convergence, budgets and cancellation.

mod common;

use common::worker::{self, Worker};
use common::{
    spawn_waiter, subscribers, through_proxy, until_subscribers, Fixture, InProcess, SingleRedis,
    PREFIX,
};
use distlock::__private::raw;
use distlock::{Backend, Lock, LockError};
use distlock_test_support::{FaultProxy, RedisServer, Reply};
use redis::AsyncCommands;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A missed wake-up under this floor shows as a wait of at least the holder's TTL (30 s).
const NO_POLLING: Duration = Duration::from_secs(30);
/// How long a notified waiter may take, on a loaded CI machine.
const PROMPT: Duration = Duration::from_secs(5);

/// A lock held on one client and a waiter on another that relies on notifications alone (its
/// backoff sleeps at least `NO_POLLING`), already subscribed.
async fn held_with_a_subscribed_waiter(
    key: &str,
) -> (
    SingleRedis,
    distlock::LockGuard,
    tokio::task::JoinHandle<Result<Instant, LockError>>,
) {
    let fx = SingleRedis::start(|b| b);
    let waiters = fx.another_backend();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    let holder = Lock::new(key).on(fx.backend()).acquire().await.unwrap();
    let waiter = spawn_waiter(&waiters, key, Duration::from_secs(60));
    until_subscribers(&fx.server, key, 1).await;
    (fx, holder, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiter_without_polling() {
    let (fx, holder, waiter) = held_with_a_subscribed_waiter("notified").await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap().unwrap();
    assert!(
        acquired - released < PROMPT,
        "woken after {:?}",
        acquired - released
    );
    until_subscribers(&fx.server, "notified", 0).await;
}

/// How long a channel stays subscribed after its last local waiter left (the runtime's
/// `SUBSCRIPTION_LINGER`).
const LINGER: Duration = Duration::from_secs(1);

/// A process that waits for the same key again while the key's channel lingers finds its
/// subscription in place: no SUBSCRIBE for that wait, and no UNSUBSCRIBE after the one before.
/// Once nobody has waited for the linger, the channel is unsubscribed, and not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_back_within_the_linger_finds_its_subscription_in_place() {
    let fx = SingleRedis::start(|b| b);
    let waiters = fx.another_backend();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    let key = "lingering";
    let (mut quick_rounds, mut left) = (0, None::<Instant>);
    for round in 0..6 {
        let holder = Lock::new(key).on(fx.backend()).acquire().await.unwrap();
        let subscribes = fx.command_calls("subscribe");
        let came_back = Instant::now();
        let waiter = spawn_waiter(&waiters, key, Duration::from_secs(60));
        common::until_waited_on(&fx, key).await;
        holder.release().await.unwrap();
        let acquired = waiter.await.unwrap().unwrap();
        assert!(acquired - came_back < PROMPT, "round {round}: woken late");
        let subscribed = fx.command_calls("subscribe") - subscribes;
        // A round that came back well within the linger must find the subscription in place;
        // a round this machine made slower than that may subscribe again.
        if let Some(since) = left.map(|left| came_back - left) {
            if since < LINGER / 2 {
                quick_rounds += 1;
                assert_eq!(
                    subscribed, 0,
                    "round {round}: subscribed again {since:?} after the last wait ended"
                );
            }
        }
        left = Some(Instant::now());
    }
    assert!(
        quick_rounds >= 3,
        "only {quick_rounds} rounds came back quickly"
    );
    let left = left.expect("six rounds ran");
    let lingering = subscribers(&fx.server, key);
    if left.elapsed() < LINGER / 2 {
        assert_eq!(lingering, 1, "unsubscribed as soon as the last wait ended");
    }
    until_subscribers(&fx.server, key, 0).await;
    assert!(
        left.elapsed() >= LINGER * 8 / 10,
        "unsubscribed {:?} after the last wait ended, before the linger was over",
        left.elapsed()
    );
    assert_eq!(
        raw::watched_channels(&waiters),
        0,
        "a local watch left behind"
    );
}

/// Waits up to `budget` for `key`, held elsewhere, and gives up busy: a waiter that was told
/// "busy" (marking the lock waited on) and is gone by the time it is released.
async fn give_up_waiting(backend: &Backend, key: &str, budget: Duration) {
    let gave_up = Lock::new(key)
        .on(backend)
        .wait(budget)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(gave_up, LockError::Busy { .. }), "{gave_up:?}");
}

/// Waits until `done` holds, for at most `limit`, checked after every change of the backends'
/// local state; `false` if it never did.
async fn until(limit: Duration, done: impl Fn() -> bool) -> bool {
    raw::until_local(limit, async || done()).await
}

/// A task that wants the key while its holder's release is on its way — here while a partition
/// holds that request unanswered — takes the turn at once (the turn passes as soon as the
/// release is sent), and its acquire follows the release on the one connection, so the server,
/// running them in order, grants it without a "busy" reply. (A task queued before the release
/// has the lock transferred to it by the release instead: `tests/transfer.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_waiter_contends_behind_the_release_on_its_way() {
    let server = RedisServer::start();
    let (proxy, backend) = through_proxy(&server, |b| b).await;
    let holder = Lock::new("handoff").on(&backend).acquire().await.unwrap();
    let first = holder.fencing_token();
    proxy.blackhole(true);
    let release = tokio::spawn(holder.release());
    assert!(
        until(PROMPT, || raw::local_keys(&backend) == 0).await,
        "the turn passed only after the release was answered"
    );
    let waiter = tokio::spawn({
        let backend = backend.clone();
        async move {
            let guard = Lock::new("handoff")
                .on(&backend)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            let token = guard.fencing_token();
            guard.release().await.unwrap();
            token
        }
    });
    assert!(until(PROMPT, || raw::local_keys(&backend) == 1).await);
    assert!(!release.is_finished(), "the partition holds the release");
    proxy.blackhole(false);
    assert_eq!(
        release.await.unwrap().unwrap(),
        distlock::Released::Released
    );
    let second = waiter.await.unwrap();
    assert!(second > first, "a new token: {second} after {first}");
    assert_eq!(
        backend.stats().busy_replies,
        0,
        "the server ran the release before the waiter's acquire"
    );
}

/// A release that other processes wait for goes to them first: the releasing process's next
/// local task, whose acquire follows the release on the same connection, is answered "busy"
/// while the notified waiter of the other process takes the lock — processes alternate instead
/// of one keeping the lock among its own tasks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_notified_waiter_of_another_process_goes_before_the_next_local_task() {
    let fx = SingleRedis::start(|b| b);
    let here = fx.backend().clone();
    // The other process is far away (its notification and its acquire each take 20 ms more),
    // so without a head start its waiter could never be first.
    let proxy = FaultProxy::start(fx.server.addr()).await;
    let elsewhere = Backend::builder(proxy.url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    // The head start must cover that distance, or the test would measure the machine.
    raw::set_reservation_window(&here, Duration::from_secs(5));
    // Load the scripts, so that the release is not sent twice (NOSCRIPT) behind the local acquire.
    Lock::new("warm-up").on(&here).run(async {}).await.unwrap();
    let holder = Lock::new("alternate").on(&here).acquire().await.unwrap();
    let remote = spawn_waiter(&elsewhere, "alternate", Duration::from_secs(30));
    until_subscribers(&fx.server, "alternate", 1).await;
    proxy.set_delay(Duration::from_millis(10));
    let local = spawn_waiter(&here, "alternate", Duration::from_secs(30));
    assert!(until(PROMPT, || raw::local_waiters(&here) == 1).await);
    holder.release().await.unwrap();
    let (remote_at, local_at) = (
        remote.await.unwrap().unwrap(),
        local.await.unwrap().unwrap(),
    );
    assert!(
        remote_at < local_at,
        "the other process's notified waiter went first ({:?} before the local task)",
        local_at - remote_at
    );
    assert!(
        here.stats().busy_replies >= 1,
        "the local task's first try was refused"
    );
}

/// The reservation window of a release whose waiter gave up costs one wait, once: the next caller is
/// turned away until the window ends, then takes the lock unmarked, and the locks after it are
/// neither announced nor reserved — no chain of windows forms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_nobody_claims_costs_one_short_wait_once() {
    let fx = SingleRedis::start(|b| b);
    let holder = Lock::new("unclaimed")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    give_up_waiting(
        &fx.another_backend(),
        "unclaimed",
        Duration::from_millis(20),
    )
    .await;
    holder.release().await.unwrap();
    assert_eq!(
        fx.command_calls("publish"),
        1,
        "the waited-on lock announced its release"
    );
    let busy_before = fx.backend().stats().busy_replies;
    for _ in 0..50 {
        Lock::new("unclaimed")
            .on(fx.backend())
            .wait(Duration::from_secs(5))
            .run(async {})
            .await
            .unwrap();
    }
    assert_eq!(
        fx.command_calls("publish"),
        1,
        "a lock taken after the window is not marked, so its release announces nothing"
    );
    let turned_away = fx.backend().stats().busy_replies - busy_before;
    assert!(
        turned_away <= 1,
        "turned away {turned_away} times in 50 cycles"
    );
}

/// A release publishes only when a caller that waits was told the lock is busy: uncontended
/// cycles and single tries cost no PUBLISH; a waiter's busy reply marks the lock, and its release
/// announces itself once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_lock_someone_waits_for_announces_its_release() {
    let fx = SingleRedis::start(|b| b);
    for _ in 0..20 {
        Lock::new("alone")
            .on(fx.backend())
            .run(async {})
            .await
            .unwrap();
    }
    assert_eq!(fx.command_calls("publish"), 0, "nobody waited: no PUBLISH");
    let holder = Lock::new("alone").on(fx.backend()).acquire().await.unwrap();
    let other = fx.another_backend();
    let tried = Lock::new("alone").on(&other).acquire().await.unwrap_err();
    assert!(matches!(tried, LockError::Busy { .. }), "{tried:?}");
    let cell = common::cell::read_cell(&fx.server, &SingleRedis::lock_key("alone"));
    assert!(
        matches!(cell, common::cell::Cell::Held { waited: false, .. }),
        "a single try does not mark the lock: {cell:?}"
    );
    give_up_waiting(&other, "alone", Duration::from_millis(50)).await;
    let cell = common::cell::read_cell(&fx.server, &SingleRedis::lock_key("alone"));
    assert!(
        matches!(cell, common::cell::Cell::Held { waited: true, .. }),
        "{cell:?}"
    );
    holder.release().await.unwrap();
    assert_eq!(
        fx.command_calls("publish"),
        1,
        "the waited-on lock announced its release"
    );
    // Within the release's reservation window a first try is refused; a caller that waits gets the
    // lock once the window passes (or at once, as a waiter, after its first "busy").
    Lock::new("alone")
        .on(fx.backend())
        .wait(Duration::from_secs(5))
        .run(async {})
        .await
        .unwrap();
    assert_eq!(
        fx.command_calls("publish"),
        1,
        "a new holder starts unmarked"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_inside_the_subscribe_window_is_not_missed() {
    let fx = SingleRedis::start(|b| b);
    let waiters = fx.another_backend();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    let window = Duration::from_millis(400);
    raw::set_subscribe_delay(&waiters, window);
    let holder = Lock::new("window")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let waiter = spawn_waiter(&waiters, "window", Duration::from_secs(60));
    // The waiter's first try is busy at once; release while it sits in the window, before it
    // has subscribed.
    tokio::time::sleep(window / 4).await;
    assert_eq!(
        subscribers(&fx.server, "window"),
        0,
        "still inside the window"
    );
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap().unwrap();
    let took = acquired - started;
    assert!(
        took >= window,
        "the waiter went through the window: {took:?}"
    );
    assert!(
        took < window + PROMPT,
        "the re-check after subscribing must catch the release: {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_subscription_connection_resubscribes_by_itself() {
    let (fx, holder, waiter) = held_with_a_subscribed_waiter("killed-sub").await;
    let killed = fx
        .server
        .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
        .as_int()
        .unwrap();
    assert_eq!(killed, 1);
    // The waiter notices, re-checks, and subscribes again on a new connection.
    until_subscribers(&fx.server, "killed-sub", 1).await;
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap().unwrap();
    assert!(
        acquired - released < PROMPT,
        "woken after {:?}",
        acquired - released
    );
}

/// Regression: the notification connection died between the server's SUBSCRIBE reply and the
/// local confirmation; the confirmation was recorded anyway, so the waiter trusted a dead
/// connection, never subscribed again and waited on backoff alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_confirmed_on_a_connection_that_died_is_made_again() {
    let fx = SingleRedis::start(|b| b);
    let proxy = FaultProxy::start(fx.server.addr()).await;
    let waiters = Backend::builder(proxy.url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    // Widen the window between the SUBSCRIBE reply and the confirmation.
    raw::set_confirm_delay(&waiters, Duration::from_millis(300));
    let holder = Lock::new("epoch").on(fx.backend()).acquire().await.unwrap();
    proxy.reset_after_reply_matching(b"subscribe");
    let waiter = spawn_waiter(&waiters, "epoch", Duration::from_secs(60));
    assert_eq!(
        proxy.dropped().await,
        1,
        "the subscription was confirmed by the server, then its connection reset"
    );
    // The waiter must see that its confirmation belongs to a dead connection and subscribe on a
    // new one: one subscribed client, after none or after another one. (The server reports no
    // connection closing, so "none" may never be seen between two events.)
    let mut none_seen = false;
    let mut oldest = None;
    let mut clients = Vec::new();
    let again = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            clients = subscribed_clients(&fx.server);
            oldest = clients.iter().copied().chain(oldest).min();
            match clients.as_slice() {
                [] => none_seen = true,
                [one] if none_seen || oldest != Some(*one) => {
                    return subscribers(&fx.server, "epoch") == 1;
                }
                _ => {}
            }
            false
        })
        .await;
    assert!(
        again,
        "never subscribed again on a new connection: subscribed clients {clients:?}"
    );
    let released = Instant::now();
    holder.release().await.unwrap();
    let acquired = waiter.await.unwrap().unwrap();
    assert!(
        acquired - released < PROMPT,
        "woken after {:?}: by backoff, not by a notification",
        acquired - released
    );
}

/// The ids of `server`'s clients subscribed to at least one channel (`CLIENT LIST`, which
/// `MONITOR` does not report).
fn subscribed_clients(server: &RedisServer) -> Vec<u64> {
    let list = server
        .command(&["CLIENT", "LIST", "TYPE", "pubsub"])
        .as_str()
        .expect("CLIENT LIST answers text");
    let field = |line: &str, name: &str| -> u64 {
        line.split(' ')
            .find_map(|pair| pair.strip_prefix(name))
            .and_then(|value| value.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {line}"))
    };
    list.lines()
        .filter(|line| field(line, "sub=") > 0)
        .map(|line| field(line, "id="))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_notification_costs_at_most_the_backoff_cap() {
    let fx = SingleRedis::start(|b| b);
    let proxy = FaultProxy::start(fx.server.addr()).await;
    let cap = Duration::from_millis(300);
    let waiters = Backend::builder(proxy.url())
        .prefix(PREFIX)
        .max_backoff(cap)
        .build()
        .unwrap();
    let holder = Lock::new("lost-note")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let waiter = spawn_waiter(&waiters, "lost-note", Duration::from_secs(60));
    until_subscribers(&fx.server, "lost-note", 1).await;
    // Let the waiter's backoff grow to its cap, so only the cap bounds the wait.
    tokio::time::sleep(cap * 4).await;
    proxy.drop_next_reply_matching(b"message", false);
    let released = Instant::now();
    holder.release().await.unwrap();
    assert_eq!(
        proxy.dropped().await,
        1,
        "the release message never reached the waiter"
    );
    let acquired = waiter.await.unwrap().unwrap();
    let took = acquired - released;
    assert!(
        took <= cap + Duration::from_millis(200),
        "a lost notification cost {took:?}"
    );
}

/// Eight callers of a second client wait 200 ms for a key held elsewhere: one contends on the
/// server, seven queue behind it locally. Every backoff sleep is at least 1 s (a test floor,
/// within the 10 s cap); clipped to what is left of the budget, every call still ends on time.
async fn budgets_end_in_busy_on_time<F: Fixture>() {
    let fx = F::start(|b| b.max_backoff(Duration::from_secs(10)));
    let _holder = Lock::new("budget")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let callers = fx.contender();
    raw::set_backoff_floor(&callers, Duration::from_secs(1));
    let budget = Duration::from_millis(200);
    let margin = Duration::from_millis(60);
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let backend = callers.clone();
        tasks.push(tokio::spawn(async move {
            let started = Instant::now();
            let err = Lock::new("budget")
                .on(&backend)
                .wait(budget)
                .acquire()
                .await
                .unwrap_err();
            (started.elapsed(), err)
        }));
    }
    for task in tasks {
        let (took, err) = task.await.unwrap();
        assert!(err.is_busy(), "{err:?}");
        assert!(
            took >= budget && took <= budget + margin,
            "gave up after {took:?}"
        );
    }
    let stats = callers.stats();
    assert!(
        stats.busy_replies >= 2,
        "the contender asked the server, and again after subscribing: {stats:?}"
    );
    assert_eq!(stats.busy, 8);
    assert_eq!(raw::local_waiters(&callers), 0);
    // On Redis the contender was the lock's next waiter: it gives that place up in the
    // background, holding its local turn until the server has it.
    let drained = raw::until_local(Duration::from_secs(5), async || {
        raw::local_keys(&callers) == 0
    })
    .await;
    assert!(drained, "{} local keys", raw::local_keys(&callers));
    assert!(callers.stats().background_releases <= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_end_in_busy_on_time_redis() {
    budgets_end_in_busy_on_time::<SingleRedis>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budgets_end_in_busy_on_time_in_process() {
    budgets_end_in_busy_on_time::<InProcess>().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_waiters_leave_no_queue_entries_or_subscriptions() {
    let fx = SingleRedis::start(|b| b);
    let waiters = fx.another_backend();
    let _holder = Lock::new("cancel")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let tasks: Vec<_> = (0..10)
        .map(|_| spawn_waiter(&waiters, "cancel", Duration::from_secs(60)))
        .collect();
    until_subscribers(&fx.server, "cancel", 1).await;
    assert!(
        until(PROMPT, || raw::local_waiters(&waiters) == 9).await,
        "the other nine never queued locally"
    );
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    assert_eq!(raw::local_waiters(&waiters), 0, "queue entries left");
    // A contender cancelled with an acquire in flight hands its turn to the background release
    // of that acquire, which passes it on one round trip later.
    assert!(
        until(PROMPT, || raw::local_keys(&waiters) == 0).await,
        "a turn left behind"
    );
    assert_eq!(
        raw::watched_channels(&waiters),
        0,
        "a local watch left behind"
    );
    until_subscribers(&fx.server, "cancel", 0).await;
}

/// Waiters on many keys at once share SUBSCRIBEs: a few go out on their own, the rest queue and
/// go out together. Waiters cancelled with their channels still queued leave none subscribed
/// (the batch carries a channel whose waiter already left, and unsubscribes it after). Each
/// round catches a few channels queued; five rounds make missing every one unlikely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_cancelled_with_their_subscriptions_queued_leave_none_subscribed() {
    let fx = SingleRedis::start(|b| b);
    for round in 0..5 {
        cancel_waiters_while_subscriptions_queue(&fx, round).await;
    }
}

/// One round: 1,000 waiters on 1,000 held keys, cancelled as soon as SUBSCRIBEs queue.
async fn cancel_waiters_while_subscriptions_queue(fx: &SingleRedis, round: usize) {
    const KEYS: usize = 1_000;
    let waiters = fx.another_backend();
    raw::set_backoff_floor(&waiters, NO_POLLING);
    let keys: Vec<String> = (0..KEYS).map(|i| format!("batched-{round}-{i}")).collect();
    let mut holders = Vec::with_capacity(KEYS);
    for key in &keys {
        holders.push(
            Lock::new(key.as_str())
                .on(fx.backend())
                .acquire()
                .await
                .unwrap(),
        );
    }
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| spawn_waiter(&waiters, key, Duration::from_secs(60)))
        .collect();
    // More are queued at that moment, and others on their way.
    assert!(
        until(PROMPT, || raw::batched_subscriptions(&waiters) > 0).await,
        "no SUBSCRIBE queued for a batch"
    );
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        assert!(task.await.unwrap_err().is_cancelled());
    }
    let pattern = common::channel(&format!("batched-{round}-*"));
    let mut left = 0;
    let cleaned = fx
        .server
        .wait_until(PROMPT, async || {
            left = subscribed_channels(&fx.server, &pattern);
            left == 0
        })
        .await;
    assert!(
        cleaned,
        "round {round}: {left} channels of cancelled waiters stayed subscribed"
    );
    assert_eq!(
        raw::watched_channels(&waiters),
        0,
        "a local watch left behind"
    );
    for holder in holders {
        holder.release().await.unwrap();
    }
}

/// Channels matching `pattern` with a subscriber on `server` (`PUBSUB CHANNELS`).
fn subscribed_channels(server: &RedisServer, pattern: &str) -> usize {
    match server.command(&["PUBSUB", "CHANNELS", pattern]) {
        Reply::Array(channels) => channels.map_or(0, |channels| channels.len()),
        other => panic!("PUBSUB CHANNELS answered {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_waiters_are_served_in_arrival_order_with_one_contender() {
    let fx = SingleRedis::start(|b| b);
    // Load the scripts: a release answered NOSCRIPT is sent again, behind the next local
    // acquire, which would then be answered "busy" once.
    Lock::new("warm-up")
        .on(fx.backend())
        .run(async {})
        .await
        .unwrap();
    let holder = Lock::new("fifo").on(fx.backend()).acquire().await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..16 {
        let backend = fx.backend().clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            Lock::new("fifo")
                .on(&backend)
                .wait(Duration::from_secs(60))
                .run(async { order.lock().unwrap().push(i) })
                .await
                .unwrap();
        }));
        // Arrival order is the order the tasks queue in.
        assert!(
            until(PROMPT, || raw::local_waiters(fx.backend()) == i + 1).await,
            "task {i} never queued"
        );
    }
    let before = fx.command_calls("evalsha");
    let busy_before = fx.backend().stats().busy_replies;
    let started = Instant::now();
    holder.release().await.unwrap();
    for task in tasks {
        task.await.unwrap();
    }
    let took = started.elapsed();
    assert_eq!(*order.lock().unwrap(), (0..16).collect::<Vec<_>>());
    let scripts = fx.command_calls("evalsha") - before;
    let retries = fx.backend().stats().busy_replies - busy_before;
    // One script per handoff: each release transfers the lock to the next local waiter, and
    // the last one frees it. The only other calls are the contender's safety-net retries (one
    // per WRITER_RETRY, 400 ms, at most). Local waiters never poll.
    assert_eq!(
        scripts,
        1 + 16 + retries,
        "{scripts} script calls for 16 handoffs, {retries} of them answered busy"
    );
    assert_eq!(fx.backend().stats().transferred, 16);
    assert!(
        retries <= 1 + (took.as_millis() / 400) as u64,
        "{retries} busy replies in {took:?}: the waiters polled"
    );
}

const WAITERS_PER_PROCESS: usize = 32;

/// Worker: WAITERS_PER_PROCESS tasks, each acquiring the key once.
#[test]
fn worker_entry() {
    let Some(_role) = worker::role() else { return };
    let url = std::env::var("REDIS_URL").unwrap();
    let runtime = worker::runtime();
    runtime.block_on(async move {
        let backend = Backend::builder(&url).prefix(PREFIX).build().unwrap();
        let client = redis::Client::open(url.as_str()).unwrap();
        let overlaps = Arc::new(AtomicUsize::new(0));
        worker::ready_then_go().await;
        let mut tasks = Vec::new();
        for _ in 0..WAITERS_PER_PROCESS {
            let backend = backend.clone();
            let mut redis = client.get_multiplexed_async_connection().await.unwrap();
            let overlaps = overlaps.clone();
            tasks.push(tokio::spawn(async move {
                Lock::new("crowd")
                    .on(&backend)
                    .wait(Duration::from_secs(60))
                    .run(async {
                        let inside: i64 = redis.incr("inside", 1).await.unwrap();
                        if inside != 1 {
                            overlaps.fetch_add(1, Ordering::Relaxed);
                        }
                        let _: i64 = redis.incr("grants", 1).await.unwrap();
                        let _: i64 = redis.decr("inside", 1).await.unwrap();
                    })
                    .await
                    .unwrap();
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
        worker::report("done", overlaps.load(Ordering::Relaxed));
    });
}

#[test]
fn sixty_four_waiters_in_two_processes_each_acquire_once() {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..2)
        .map(|_| Worker::spawn("worker_entry", "crowd", &[("REDIS_URL", server.url())]))
        .collect();
    let started = worker::start_together(&mut workers);
    let overlaps: usize = workers
        .iter()
        .map(|worker| {
            worker
                .expect("done", Duration::from_secs(120))
                .parse::<usize>()
                .unwrap()
        })
        .sum();
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    let grants = server.command(&["GET", "grants"]).as_int().unwrap();
    eprintln!("WAITING crowd: 2 processes x {WAITERS_PER_PROCESS} waiters: {grants} grants, {overlaps} double grants in {:?}", started.elapsed());
    assert_eq!(grants, 2 * WAITERS_PER_PROCESS as i64);
    assert_eq!(overlaps, 0);
}

/// A waiting writer's intent outlives a reader whose lease runs out before it (a reader that
/// crashed): a new reader that asks when that lease ends does not go before the writer. Found
/// by the model checker (tests/model): the intent lived in the lock's value, which expired with
/// the last reader's lease, so every reader that asked before the writer's next try went
/// first — once per reader lease that ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writers_intent_outlives_a_reader_whose_lease_ran_out() {
    use distlock::{Lease, LockKind};
    use distlock_test_support::{wait_until, Wake};
    let fx = SingleRedis::start(|b| b);
    let (writing, reading) = (fx.contender(), fx.contender());
    // The writer's next try comes well after the reader's lease ends (it would otherwise ask
    // again the moment that lease ends, and a reader would have to come within that moment).
    raw::set_acquire_reply_delay(&writing, Duration::from_millis(500));
    let read = |backend: &Backend| Lock::new("intent").kind(LockKind::Read).on(backend);
    // A reader that will not release: its lease (300 ms) runs out.
    let crashed = read(fx.backend())
        .lease(Lease::Fixed(Duration::from_millis(300)))
        .acquire()
        .await
        .unwrap();
    let writer = {
        let writing = writing.clone();
        tokio::spawn(async move {
            Lock::new("intent")
                .on(&writing)
                .wait(PROMPT)
                .acquire()
                .await
        })
    };
    let lock = SingleRedis::lock_key("intent");
    let value = |server: &RedisServer| server.command(&["GET", &lock]);
    let intent = fx
        .server
        .wait_until(PROMPT, async || {
            value(&fx.server)
                .as_str()
                .is_some_and(|v| v.starts_with('S'))
        })
        .await;
    assert!(
        intent,
        "the writer never left its intent: {:?}",
        value(&fx.server)
    );
    // The reader's lease runs out: its set of holders expires with it.
    let holders = format!("{lock}:holders");
    let ran_out = wait_until(
        &[&fx.server],
        Wake::CommandsAndExpiries,
        PROMPT,
        async || fx.server.command(&["EXISTS", &holders]).as_int() == Some(0),
    )
    .await;
    assert!(ran_out, "the reader's lease never ran out");
    let late = read(&reading).acquire().await;
    assert!(
        matches!(&late, Err(err) if err.is_busy()),
        "a reader went before the waiting writer: {late:?}, the lock {:?}",
        value(&fx.server).as_str()
    );
    let writer = writer.await.unwrap().unwrap();
    writer.release().await.unwrap();
    drop(crashed);
}
