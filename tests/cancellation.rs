//! Cancellation at random points: locked calls dropped before their acquire is sent, with it in
//! flight, while waiting, in the body and with the release in flight must leave no lock held
//! 200 ms after the last cancellation, on the in-process backend, a real Redis, a real Valkey
//! (whose releases are conditional writes), Redlock over three real masters, a 3-member etcd
//! cluster and a 3-server ZooKeeper ensemble (where a waiter that left must also leave the lock's
//! queue), PostgreSQL and MariaDB.
//!
//! tokio's timer only resolves milliseconds, so the cancellations are fired from a thread of
//! their own, which sleeps and then spins to its target instant: microsecond resolution. Each call
//! records the phase it is in; the phase it was dropped in is the last one it recorded. The test
//! prints the histogram of cancellation points as a `CANCEL …` line.

mod common;

use common::{
    Etcd, Fixture, InProcess, Mysql, Postgres, Redlock, SingleRedis, UnfencedRedis, Valkey,
    Zookeeper,
};
use distlock::__private::raw;
use distlock::{distributed_lock, Backend, Lease, Lock, LockError, Registry};
use distlock_test_support::Xorshift;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;

/// Calls per stream (twice as many on ZooKeeper); several streams run at once, so local queues
/// see cancellations too.
const CALLS_PER_STREAM: usize = 200;
/// More concurrent calls than a Redis engine sends on their own (4 of a kind), so that calls also
/// queue for a batch (group commit) and are cancelled there.
const STREAMS: usize = 6;
/// Keys a second client holds for the whole run: calls on them wait.
const BLOCKED_KEYS: usize = 3;
/// The property under test: no lock held this long after the last cancellation.
const SETTLE: Duration = Duration::from_millis(200);

/// Where a call is: recorded by the call itself as it goes.
mod phase {
    pub const NOT_STARTED: u8 = 0;
    /// Inside `run`/`acquire`/the annotated call, before the body: the acquire (a free key) or
    /// waiting (a blocked key).
    pub const ACQUIRING: u8 = 1;
    pub const BODY: u8 = 2;
    /// The body is done; the release is in flight.
    pub const RELEASING: u8 = 3;
    pub const FINISHED: u8 = 4;
}

#[derive(Debug, Default)]
struct Histogram {
    not_started: usize,
    acquire: usize,
    wait: usize,
    body: usize,
    release: usize,
    finished: usize,
}

/// The ways a user holds a lock: `Lock::run`, a guard, the attribute.
#[derive(Debug, Clone, Copy)]
enum Style {
    Run,
    Guard,
    Attribute,
}

/// The body of every call: long enough (about a millisecond) to be cancelled in, with awaits.
async fn body(probe: &AtomicU8) {
    probe.store(phase::BODY, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    probe.store(phase::RELEASING, Ordering::SeqCst);
}

macro_rules! annotated {
    ($name:ident, $backend:literal) => {
        #[distributed_lock(key = "<key>", wait = "forever", backend = $backend)]
        async fn $name(key: &str, probe: &AtomicU8) -> Result<(), LockError> {
            body(probe).await;
            Ok(())
        }
    };
}
annotated!(annotated_in_process, "cancel-in-process");
annotated!(annotated_redis, "cancel-redis");
annotated!(annotated_unfenced, "cancel-unfenced");
annotated!(annotated_valkey, "cancel-valkey");
annotated!(annotated_redlock, "cancel-redlock");
annotated!(annotated_etcd, "cancel-etcd");
annotated!(annotated_postgres, "cancel-postgres");
annotated!(annotated_mysql, "cancel-mysql");
annotated!(annotated_zookeeper, "cancel-zookeeper");

type BoxedCall<'a> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LockError>> + Send + 'a>>;
type Annotated = for<'a> fn(&'a str, &'a AtomicU8) -> BoxedCall<'a>;

async fn call(backend: Backend, key: String, style: Style, probe: Arc<AtomicU8>, attr: Annotated) {
    probe.store(phase::ACQUIRING, Ordering::SeqCst);
    let lock = Lock::new(key.clone()).on(&backend).wait_forever();
    let outcome = match style {
        Style::Run => lock.run(body(&probe)).await,
        Style::Guard => match lock.acquire().await {
            Ok(guard) => {
                body(&probe).await;
                guard.release().await.map(drop)
            }
            Err(err) => Err(err),
        },
        Style::Attribute => attr(&key, &probe).await,
    };
    outcome.expect("an uncancelled call succeeds");
    probe.store(phase::FINISHED, Ordering::SeqCst);
}

/// Fires `abort` at `at`: sleeps until just before, then spins, for microsecond precision.
fn canceller(orders: mpsc::Receiver<(AbortHandle, Instant)>) {
    const SPIN: Duration = Duration::from_micros(200);
    for (handle, at) in orders {
        let now = Instant::now();
        if at > now + SPIN {
            std::thread::sleep(at - now - SPIN);
        }
        while Instant::now() < at {
            std::hint::spin_loop();
        }
        handle.abort();
    }
}

/// How long an uncancelled call of each kind takes with as many calls at once as the run
/// makes: the span cancellation delays are drawn from.
async fn calibrate(backend: &Backend, attr: Annotated) -> Duration {
    let mut took = Vec::new();
    for round in 0..20 {
        let calls = (0..STREAMS).map(|stream| {
            let style = [Style::Run, Style::Guard, Style::Attribute][(round + stream) % 3];
            let key = format!("calibrate-{round}-{stream}");
            let call = call(backend.clone(), key, style, Arc::default(), attr);
            async move {
                let started = Instant::now();
                call.await;
                started.elapsed()
            }
        });
        took.extend(futures_util::future::join_all(calls).await);
    }
    took.sort();
    took[took.len() / 2]
}

/// The backends' runs take turns: each aims its cancellations at phases timed on an idle machine
/// (`calibrate`), which another run beside it would shift.
static ONE_BACKEND_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// On MySQL, no transaction is left open on the server: each request is one procedure call that
/// commits or rolls back before it answers, so none cancelled mid-way leaves one behind.
fn no_transaction_left_open<F: Fixture>(fx: &F) {
    let open_transactions = fx
        .mysql()
        .map(|server| server.sql("SELECT COUNT(*) FROM information_schema.INNODB_TRX"));
    assert!(
        open_transactions.as_deref().is_none_or(|open| open == "0"),
        "{open_transactions:?} transactions left open"
    );
}

async fn cancelled_calls_leave_nothing_held<F: Fixture>(
    registry_name: &'static str,
    attr: Annotated,
) {
    let _turn = ONE_BACKEND_AT_A_TIME.lock().await;
    let fx = F::start(|b| b);
    let backend = fx.backend().clone();
    Registry::global()
        .register(registry_name, backend.clone())
        .unwrap();
    let blocker = fx.contender();
    let mut blocked = Vec::new();
    for i in 0..BLOCKED_KEYS {
        blocked.push(
            Lock::new(format!("blocked-{i}"))
                .on(&blocker)
                .acquire()
                .await
                .unwrap(),
        );
    }
    let typical = calibrate(&backend, attr).await;
    // ZooKeeper answers a session's requests in order, so its six streams' calls take about
    // 60 ms each, of which the body is one: twice the calls give its body and release phases
    // about as many cancellations as the other stores'.
    let calls_per_stream = match fx.kind() {
        "zookeeper" => 2 * CALLS_PER_STREAM,
        _ => CALLS_PER_STREAM,
    };

    let (orders, received) = mpsc::channel();
    let cancel_thread = std::thread::spawn(move || canceller(received));
    let (_, seed) = Xorshift::from_clock();
    let used_keys = Arc::new(std::sync::Mutex::new(Vec::new()));
    let counts = Arc::new(std::sync::Mutex::new(Histogram::default()));
    let calls = Arc::new(AtomicUsize::new(0));
    let mut streams = Vec::new();
    for stream in 0..STREAMS {
        let (backend, orders) = (backend.clone(), orders.clone());
        let (used_keys, counts, calls) = (used_keys.clone(), counts.clone(), calls.clone());
        streams.push(tokio::spawn(async move {
            let mut rng = Xorshift::new(seed.wrapping_add(stream as u64 * 0x9e37_79b9));
            for i in 0..calls_per_stream {
                let waits = i % 4 == 3;
                let key = if waits {
                    format!("blocked-{}", rng.next_u64() % BLOCKED_KEYS as u64)
                } else {
                    format!("free-{stream}-{i}")
                };
                used_keys.lock().unwrap().push(key.clone());
                let style =
                    [Style::Run, Style::Guard, Style::Attribute][(rng.next_u64() % 3) as usize];
                // Mostly inside one typical call, sometimes a little past it, some at once, and
                // some early in it, where the acquire is (a small part of a typical call, which
                // the body's sleep dominates: a round trip, or a few while queued for a batch).
                let delay = match rng.next_u64() % 8 {
                    0 => rng.duration_below(Duration::from_micros(20)),
                    1 | 2 => rng.duration_below(typical / 8),
                    3 => rng.duration_below(typical / 32),
                    7 => typical + rng.duration_below(typical / 2),
                    _ => rng.duration_below(typical),
                };
                let probe = Arc::new(AtomicU8::new(phase::NOT_STARTED));
                let spawned_at = Instant::now();
                let task = tokio::spawn(call(backend.clone(), key, style, probe.clone(), attr));
                orders
                    .send((task.abort_handle(), spawned_at + delay))
                    .unwrap();
                let cancelled = match task.await {
                    Ok(()) => false,
                    Err(err) => {
                        assert!(err.is_cancelled(), "a call panicked: {err}");
                        true
                    }
                };
                calls.fetch_add(1, Ordering::Relaxed);
                let mut counts = counts.lock().unwrap();
                match (cancelled, probe.load(Ordering::SeqCst)) {
                    (false, _) => counts.finished += 1,
                    (true, phase::NOT_STARTED) => counts.not_started += 1,
                    (true, phase::ACQUIRING) if waits => counts.wait += 1,
                    (true, phase::ACQUIRING) => counts.acquire += 1,
                    (true, phase::BODY) => counts.body += 1,
                    (true, phase::RELEASING) => counts.release += 1,
                    (true, other) => panic!("cancelled after finishing? phase {other}"),
                }
            }
        }));
    }
    drop(orders);
    for stream in streams {
        stream.await.unwrap();
    }
    cancel_thread.join().unwrap();
    for guard in blocked {
        guard.release().await.unwrap();
    }
    let last_cancellation = Instant::now();

    // The property itself is a deadline: wait it out, then look at the server.
    tokio::time::sleep(SETTLE).await;
    let keys = used_keys.lock().unwrap().clone();
    let held = fx.held_keys(&keys).await;
    no_transaction_left_open(&fx);
    let stats = backend.stats();
    let counts = counts.lock().unwrap();
    eprintln!(
        "CANCEL {}: {} calls (typical {typical:?}, seed {seed:#x}) cancelled: not started {}, \
         acquire {}, wait {}, body {}, release {}; finished {}; batched {}; background releases {}; \
         left to expire {}; locks held {SETTLE:?} after the last cancellation: {}",
        fx.kind(),
        calls.load(Ordering::Relaxed),
        counts.not_started,
        counts.acquire,
        counts.wait,
        counts.body,
        counts.release,
        counts.finished,
        raw::batched_calls(&backend),
        stats.background_releases,
        stats.left_to_expire,
        held.len(),
    );
    assert_eq!(
        held,
        Vec::<String>::new(),
        "locks left held by cancelled calls"
    );
    assert!(
        last_cancellation.elapsed() < SETTLE * 5,
        "the check itself was slow"
    );
    assert_eq!(stats.left_to_expire, 0);
    for (name, client) in [("caller", &backend), ("blocker", &blocker)] {
        assert_eq!(
            raw::watched_leases(client),
            0,
            "{name}: a lease still renewed"
        );
        assert_eq!(
            raw::local_waiters(client),
            0,
            "{name}: a waiter still queued"
        );
        assert_eq!(raw::local_keys(client), 0, "{name}: a local turn left out");
        assert_eq!(
            raw::watched_channels(client),
            0,
            "{name}: a watch left behind"
        );
    }
    if fx.kind() == "redis" {
        assert!(
            raw::batched_calls(&backend) > 0,
            "no call waited for a batch: group commit was not exercised"
        );
    }
    // Every phase the backend can be dropped in was hit, many times: in-process acquires and
    // releases complete without yielding, so only Redis has those two windows.
    let mut phases = vec![("wait", counts.wait), ("body", counts.body)];
    if fx.kind() != "in-process" {
        phases.extend([("acquire", counts.acquire), ("release", counts.release)]);
    }
    for (name, hits) in phases {
        assert!(
            hits >= 15,
            "only {hits} cancellations hit the {name} phase: {counts:?}"
        );
    }
}

// Keys are letters, digits and `-` only, so the attribute renders `<key>` unescaped and every
// style locks the same key for the same name.
fn attr_in_process<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_in_process(key, probe))
}

fn attr_redis<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_redis(key, probe))
}

fn attr_valkey<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_valkey(key, probe))
}

fn attr_redlock<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_redlock(key, probe))
}

fn attr_etcd<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_etcd(key, probe))
}

fn attr_postgres<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_postgres(key, probe))
}

fn attr_unfenced<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_unfenced(key, probe))
}

fn attr_mysql<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_mysql(key, probe))
}

fn attr_zookeeper<'a>(key: &'a str, probe: &'a AtomicU8) -> BoxedCall<'a> {
    Box::pin(annotated_zookeeper(key, probe))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_in_process() {
    cancelled_calls_leave_nothing_held::<InProcess>("cancel-in-process", attr_in_process).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_redis() {
    cancelled_calls_leave_nothing_held::<SingleRedis>("cancel-redis", attr_redis).await;
}

/// Efficiency locks: a first try is a `SET NX PX` claim, followed by the script when the key is
/// taken; cancelled at any point of either, nothing stays held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_with_efficiency_locks() {
    cancelled_calls_leave_nothing_held::<UnfencedRedis>("cancel-unfenced", attr_unfenced).await;
}

/// Valkey releases uncontended locks with a conditional `SET … IFEQ`, not a script: cancelled
/// there too, it must leave nothing held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_valkey() {
    cancelled_calls_leave_nothing_held::<Valkey>("cancel-valkey", attr_valkey).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_redlock() {
    cancelled_calls_leave_nothing_held::<Redlock>("cancel-redlock", attr_redlock).await;
}

/// On etcd a cancelled waiter leaves a queue entry behind unless it deletes it: one left would
/// hold up everyone behind it until its lease ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_etcd() {
    cancelled_calls_leave_nothing_held::<Etcd>("cancel-etcd", attr_etcd).await;
}

/// On PostgreSQL too a cancelled waiter leaves a row behind unless it deletes it, and a join
/// cancelled on its way runs to its end first; no transaction is left open either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_postgres() {
    cancelled_calls_leave_nothing_held::<Postgres>("cancel-postgres", attr_postgres).await;
}

/// On MySQL a cancelled waiter's row must go too, a join cancelled on its way runs to its end
/// first, and no transaction is left open (each request is one procedure call that commits or
/// rolls back before it answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_mysql() {
    cancelled_calls_leave_nothing_held::<Mysql>("cancel-mysql", attr_mysql).await;
}

/// On ZooKeeper a cancelled waiter's node must go too (its session lives on with the process,
/// so a node left behind would hold up everyone behind it), and a create cancelled on its way
/// runs to its end first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_calls_leave_no_lock_held_zookeeper() {
    cancelled_calls_leave_nothing_held::<Zookeeper>("cancel-zookeeper", attr_zookeeper).await;
}

/// With no runtime left to run a background release, the lock expires by its TTL, and the stats
/// say so: a guard dropped by a runtime that shuts down, and one dropped on a plain thread.
#[test]
fn locks_dropped_with_no_runtime_to_release_them_are_counted() {
    let fx = SingleRedis::start(|b| b);
    let backend = fx.backend().clone();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (held_tx, held_rx) = std::sync::mpsc::channel();
    let guard_of_thread = runtime.block_on(async {
        let owner = backend.clone();
        runtime_spawned_holder(owner, held_tx);
        Lock::new("on-a-thread")
            .on(&backend)
            .acquire()
            .await
            .unwrap()
    });
    held_rx.recv().unwrap();
    // The runtime shuts down with a task that holds a guard: the task is dropped, its guard
    // tries to release, and the runtime refuses new tasks.
    drop(runtime);
    assert_eq!(backend.stats().left_to_expire, 1, "{:?}", backend.stats());
    // A guard dropped on a thread with no runtime at all.
    std::thread::spawn(move || drop(guard_of_thread))
        .join()
        .unwrap();
    let stats = backend.stats();
    assert_eq!(stats.left_to_expire, 2, "{stats:?}");
    for key in ["in-a-task", "on-a-thread"] {
        let pttl = common::held_pttl(&fx.server, &SingleRedis::lock_key(key));
        assert!(
            pttl.is_some_and(|ttl| ttl > Duration::ZERO),
            "{key} is left to its TTL: {pttl:?}"
        );
    }
}

fn runtime_spawned_holder(backend: Backend, held: mpsc::Sender<()>) {
    tokio::spawn(async move {
        let _guard = Lock::new("in-a-task").on(&backend).acquire().await.unwrap();
        held.send(()).unwrap();
        std::future::pending::<()>().await;
    });
}

/// The in-process backend needs no runtime to release: a guard dropped on a plain thread frees
/// its lock at once.
#[test]
fn an_in_process_lock_dropped_with_no_runtime_is_released_at_once() {
    let backend = Backend::in_process();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime
        .block_on(Lock::new("on-a-thread").on(&backend).acquire())
        .unwrap();
    drop(runtime);
    std::thread::spawn(move || drop(guard)).join().unwrap();
    let stats = backend.stats();
    assert_eq!((stats.released, stats.left_to_expire), (1, 0), "{stats:?}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(
        runtime.block_on(backend.inspect("on-a-thread")).unwrap(),
        None
    );
}

/// `Backend::events`: following stops when the `LockEvents` is dropped — its keyspace
/// subscription leaves the server: the follower sends `UNSUBSCRIBE`, which wakes the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_lock_events_ends_their_subscription() {
    let server = distlock_test_support::RedisServer::start();
    let backend = Backend::builder(server.url()).build().unwrap();
    let channel = "__keyspace@0__:distlock:{followed}";
    let subscribers = || server.subscribers(channel);
    let events = backend
        .events("followed", distlock::Notifications::Enable)
        .await
        .unwrap();
    assert_eq!(subscribers(), 1, "subscribed once the call resolved");
    drop(events);
    // The follower unsubscribes (a closed connection alone would be no event the wait sees).
    let ended = server
        .wait_until(Duration::from_secs(5), async || subscribers() == 0)
        .await;
    assert!(ended, "the subscription outlived its LockEvents");
}

/// A runtime that shuts down while acquires are in flight and others queue for a batch (group
/// commit) takes the task that would have sent the queue with it; the backend, used from another
/// runtime, still answers at once (the batch's in-flight slots came back).
#[test]
fn a_runtime_dropped_with_a_batch_pending_leaves_the_backend_working() {
    let server = distlock_test_support::RedisServer::start();
    let (first, proxy, backend, _) = acquires_queued_behind_a_partition(&server, Lease::Watchdog);
    drop(first);
    proxy.blackhole(false);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let acquired = tokio::time::timeout(
            Duration::from_secs(5),
            Lock::new("after").on(&backend).acquire(),
        )
        .await
        .expect("an acquire queued for ever behind the dropped runtime's batch");
        acquired.unwrap().release().await.unwrap();
    });
}

/// Acquires cancelled while they queue for a batch (group commit) are still sent with it, and the
/// locks the batch grants them are released at once (`Batched::abandoned`), not left to their
/// lease: another client takes each key within a second, where the lease is 30 s.
#[test]
fn acquires_cancelled_in_a_batch_queue_leave_nothing_held() {
    let server = distlock_test_support::RedisServer::start();
    let lease = Lease::Fixed(Duration::from_secs(30));
    let (runtime, proxy, _backend, tasks) = acquires_queued_behind_a_partition(&server, lease);
    let other = Backend::builder(server.url())
        .prefix(common::PREFIX)
        .build()
        .unwrap();
    // The queued acquires' callers leave; then the network heals and the batch goes out.
    for task in &tasks[IN_FLIGHT..] {
        task.abort();
    }
    proxy.blackhole(false);
    runtime.block_on(async {
        for i in IN_FLIGHT..IN_FLIGHT + QUEUED {
            let taken = Lock::new(format!("pending:{i}"))
                .wait(Duration::from_secs(1))
                .on(&other)
                .acquire()
                .await;
            assert!(
                taken.is_ok(),
                "pending:{i} stayed held after its caller left the batch queue: {taken:?}"
            );
            taken.unwrap().release().await.unwrap();
        }
    });
}

/// Calls of a kind a Redis engine keeps in flight before new ones queue for a batch
/// (`MAX_IN_FLIGHT` in `engines/redis/group_commit.rs`).
const IN_FLIGHT: usize = 4;
/// Acquires queued behind them by [`acquires_queued_behind_a_partition`].
const QUEUED: usize = 10;

/// On a one-worker runtime, a backend behind a fault proxy that holds every byte (a partition):
/// [`IN_FLIGHT`] acquires of `pending:<i>` with `lease` held in flight by the proxy, and
/// [`QUEUED`] more queued behind them for a batch. Returns the runtime, the proxy, the backend
/// and the acquires' tasks, in the order of `i`.
fn acquires_queued_behind_a_partition(
    server: &distlock_test_support::RedisServer,
    lease: Lease,
) -> (
    tokio::runtime::Runtime,
    distlock_test_support::FaultProxy,
    Backend,
    Vec<tokio::task::JoinHandle<()>>,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    // Connected, scripts loaded: what follows is only the acquires under test.
    let (proxy, backend) = runtime.block_on(common::through_proxy(server, |b| b));
    proxy.blackhole(true);
    let mut tasks = Vec::new();
    for i in 0..IN_FLIGHT + QUEUED {
        let backend = backend.clone();
        tasks.push(runtime.spawn(async move {
            let _ = Lock::new(format!("pending:{i}"))
                .lease(lease)
                .on(&backend)
                .acquire()
                .await;
        }));
        if i + 1 == IN_FLIGHT {
            assert!(
                proxy.wait_requests_held(1, Duration::from_secs(5)),
                "the acquires never left"
            );
        }
    }
    assert!(
        raw::wait_local(Duration::from_secs(5), || raw::batched_calls(&backend)
            >= QUEUED as u64),
        "the acquires never queued"
    );
    (runtime, proxy, backend, tasks)
}

/// An acquire whose reply is lost, during an outage that outlasts the quick retries of the
/// release sent on its behalf: the release keeps trying in the background, and frees the lock
/// once the server is reachable again — not a whole TTL later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_is_released_after_an_outage_not_left_to_its_ttl() {
    let server = distlock_test_support::RedisServer::start();
    let (proxy, backend) =
        common::through_proxy(&server, |b| b.max_backoff(Duration::from_millis(100))).await;
    // The open connection carries the acquire, whose reply is lost with the connection; every
    // new connection is refused until the outage ends.
    proxy.refuse(true);
    proxy.drop_next_reply();
    Lock::new("lost").on(&backend).acquire().await.unwrap_err();
    let key = &SingleRedis::lock_key("lost");
    assert!(
        common::held_pttl(&server, key).is_some_and(|ttl| ttl > Duration::from_secs(20)),
        "the lost acquire took the lock for its TTL"
    );
    let direct = Backend::builder(server.url())
        .prefix(common::PREFIX)
        .build()
        .unwrap();
    let mut events = direct
        .events("lost", distlock::Notifications::Enable)
        .await
        .unwrap();
    // An outage past the quick retries of the release sent for the lost acquire.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.refuse(false);
    let freed = tokio::time::timeout(Duration::from_secs(5), async {
        while let Some(event) = events.next().await {
            if event.unwrap().holder.is_none() {
                return;
            }
        }
    })
    .await;
    assert!(
        freed.is_ok() && common::held_pttl(&server, key).is_none(),
        "the lock was left to its TTL after the outage"
    );
}

/// A guard that outlives its runtime, which shut down with a renewal of its lease in flight:
/// once another lock starts a watchdog on a new runtime, the lease is renewed again and stays
/// held for three TTLs (the dropped renewal left no mark that hides it from the new task).
#[test]
fn a_lease_whose_renewal_died_with_its_runtime_is_renewed_by_the_next_watchdog() {
    let ttl = Duration::from_millis(1500);
    let server = distlock_test_support::RedisServer::start();
    let first = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (proxy, backend, guard) = first.block_on(async {
        let (proxy, backend) = common::through_proxy(&server, |b| b.watchdog_lease(ttl)).await;
        let guard = Lock::new("kept").on(&backend).acquire().await.unwrap();
        (proxy, backend, guard)
    });
    // The first renewal (a third of the TTL in) is held in flight; then the runtime goes.
    proxy.blackhole(true);
    assert!(proxy.wait_requests_held(1, ttl), "no renewal was sent");
    drop(first);
    proxy.blackhole(false);
    let second = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    second.block_on(async {
        let other = Lock::new("other").on(&backend).acquire().await.unwrap();
        // No event marks a lease not being renewed: outliving three TTLs is the point.
        tokio::time::sleep(ttl * 3).await;
        assert!(
            guard.is_held(),
            "the lease was never renewed after its runtime went: {:?}",
            guard.check()
        );
        other.release().await.unwrap();
        guard.release().await.unwrap();
    });
}
