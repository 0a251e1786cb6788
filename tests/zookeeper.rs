//! The ZooKeeper engine under faults, on a real 3-server ensemble started per test: its leader
//! killed and a follower paused under load from several processes, a holder paused past its
//! session, a holder cut off from every server, a create whose reply is lost, the majority of
//! servers down. A separate Redis (the resource) records every critical section and fences its
//! writes.
//!
//! Figures are printed as `ZOOKEEPER …` lines on stderr.

mod common;

use common::sections::{self, Tally};
use common::worker::{self, Worker};
use common::zookeeper::{connect, until_on_zookeeper};
use common::PREFIX;
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError, LostReason};
use distlock_test_support::{FaultProxy, Framing, RedisServer, ZkEnsemble};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

const PROCESSES: usize = 3;
/// The paused holder's watchdog lease; its session lasts four thirds of it.
const HOLDER_LEASE: Duration = Duration::from_secs(1);

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    worker::runtime().block_on(async move {
        match role.as_str() {
            "sections" => sections::run().await,
            "hold" => hold().await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

fn backend(url: &str, lease: Duration) -> Backend {
    Backend::builder(url)
        .prefix(PREFIX)
        .watchdog_lease(lease)
        .build()
        .unwrap()
}

/// `zookeeper://` through a proxy per server, each cutting ZooKeeper's packets.
async fn proxied(ensemble: &ZkEnsemble) -> (String, Vec<FaultProxy>) {
    let mut proxies = Vec::new();
    for i in 0..3 {
        let server: SocketAddr = ([127, 0, 0, 1], ensemble.client_port(i)).into();
        proxies.push(FaultProxy::start_framed(server, Framing::LengthPrefixed).await);
    }
    let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    (format!("zookeeper://{}", hosts.join(",")), proxies)
}

/// 3 processes × 4 tasks loop fenced sections on one key; a follower is paused for a while,
/// then the leader is killed and later started again. Every section completes, none overlaps,
/// no token goes back, the fence rejects nothing.
#[test]
fn leader_killed_and_follower_paused_under_load_never_overlap_or_go_back() {
    let mut ensemble = ZkEnsemble::start(3);
    let resource = RedisServer::start();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|index| {
            let env = sections::worker_env(&ensemble.url(), &resource, index);
            let env: Vec<(&str, String)> = env.into_iter().collect();
            Worker::spawn("worker_entry", "sections", &env)
        })
        .collect();
    worker::start_together(&mut workers);
    sections::wait_for_tokens(&resource, 100);

    let leader = ensemble.leader();
    let follower = (leader + 1) % 3;
    ensemble.pause(follower);
    let paused_at = sections::tokens_len(&resource);
    sections::wait_for_tokens(&resource, paused_at + 100);
    ensemble.resume(follower);

    let before_kill = sections::tokens_len(&resource);
    let killed_at = Instant::now();
    ensemble.kill(leader);
    let new_leader = ensemble.leader();
    let elected = killed_at.elapsed();
    sections::wait_for_tokens(&resource, before_kill + 100);
    let resumed = killed_at.elapsed();
    ensemble.restart(leader);
    sections::wait_for_tokens(&resource, sections::tokens_len(&resource) + 100);

    let total = Tally::collect(&mut workers);
    let tokens = sections::tokens(&resource);
    let regressions = sections::regressions(&tokens);
    eprintln!(
        "ZOOKEEPER faults under load: {PROCESSES} processes x {} tasks, {} sections; follower \
         {follower} paused during sections {paused_at}..{}, leader {leader} killed after \
         {before_kill} ({new_leader} led {elected:?} later, 100 more sections {resumed:?} after \
         the kill); {} overlaps, {regressions} token regressions, {} fenced writes rejected, {} \
         errors",
        sections::TASKS,
        total.sections,
        paused_at + 100,
        total.overlaps,
        total.rejected,
        total.errors,
    );
    assert_eq!(total.overlaps, 0, "critical sections overlapped");
    assert_eq!(regressions, 0, "fencing tokens went back");
    assert_eq!(total.rejected, 0, "a fenced write was rejected");
    assert_eq!(total.errors, 0, "a section did not complete");
    assert_eq!(
        tokens.len() as u64,
        total.sections,
        "every section recorded its token"
    );
}

/// Takes the lock `held`, reports its token, and waits for the parent; then checks and writes.
async fn hold() {
    let backend = backend(&std::env::var("LOCK_URL").unwrap(), HOLDER_LEASE);
    let fenced = FencedStore::open(&std::env::var("RESOURCE_URL").unwrap()).unwrap();
    worker::hold_then_write_late(&backend, &fenced).await;
}

/// A holder stopped (SIGSTOP) while its watchdog keeps a 1 s lease: ZooKeeper ends its session
/// (4/3 s without a word from it) and deletes its node, and another process takes the lock —
/// only after the holder's own validity has ended, with a larger token; on SIGCONT the holder's
/// checkpoint says the lease expired and the fence rejects its late write.
#[test]
fn a_paused_holder_wakes_up_lost_and_its_late_write_is_rejected() {
    let ensemble = ZkEnsemble::start(3);
    let resource = RedisServer::start();
    let env = [
        ("LOCK_URL", ensemble.url()),
        ("RESOURCE_URL", resource.url()),
    ];
    let mut holder = Worker::spawn("worker_entry", "hold", &env);
    let stale: u64 = holder
        .expect("acquired", Duration::from_secs(30))
        .parse()
        .unwrap();
    holder.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();

    let runtime = worker::runtime();
    let taker = backend(&ensemble.url(), Duration::from_secs(5));
    let (guard, taken_at) = runtime.block_on(worker::take_over_and_write(&taker, &resource.url()));
    let fresh = guard.fencing_token();
    holder.signal(libc::SIGCONT);
    holder.send("go");
    let checkpoint = holder.expect("checkpoint", Duration::from_secs(30));
    let write = holder.expect("write", Duration::from_secs(30));
    assert!(holder.wait().success());
    runtime.block_on(guard.release()).unwrap();
    let taken_after = taken_at - stopped_at;
    eprintln!(
        "ZOOKEEPER pause: holder with a {HOLDER_LEASE:?} watchdog lease stopped; lock taken \
         over after {taken_after:?} with token {fresh} (the holder's {stale}); on SIGCONT its \
         checkpoint said `{checkpoint}`; its late write: {write}"
    );
    assert!(fresh > stale, "the new holder's token is larger");
    let least = HOLDER_LEASE * 2 / 3 - HOLDER_LEASE / 100 - Duration::from_millis(2);
    assert!(
        taken_after >= least,
        "taken over {taken_after:?} after the stop, while the holder could still believe it \
         held the lock (its validity lasts at least {least:?} past the stop)"
    );
    assert_eq!(checkpoint, "lost Some(Expired)");
    assert_eq!(
        write,
        format!("{:?}", FencedWrite::Rejected { highest: fresh })
    );
}

/// A holder cut off from every server (each of its connections blackholed by a proxy): it
/// learns from its own clock that its lease is gone before ZooKeeper ends its session and
/// grants the lock to a waiter of another process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_cut_off_learns_it_lost_the_lock_before_it_is_granted_elsewhere() {
    let ensemble = ZkEnsemble::start(3);
    let (url, proxies) = proxied(&ensemble).await;
    let holder = backend(&url, HOLDER_LEASE);
    let guard = Lock::new("cut").on(&holder).acquire().await.unwrap();
    let waiter = backend(&ensemble.url(), Duration::from_secs(5));
    let waiting = {
        let waiter = waiter.clone();
        tokio::spawn(async move {
            let guard = Lock::new("cut")
                .on(&waiter)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            (guard, Instant::now())
        })
    };
    let queued = until_on_zookeeper(&ensemble, Duration::from_secs(5), async || {
        let held = waiter.inspect("cut").await.unwrap();
        held.and_then(|held| held.waiting) == Some(1)
    })
    .await;
    assert!(queued, "the waiter never queued");
    for proxy in &proxies {
        proxy.blackhole(true);
    }
    let cut_at = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder learns it lost the lock");
    let lost_at = Instant::now();
    let (taken, taken_at) = waiting.await.unwrap();
    eprintln!(
        "ZOOKEEPER cut off: holder with a {HOLDER_LEASE:?} lease cut off from every server; it \
         learnt it lost the lock {:?} after the cut ({lost}), the waiter was granted it {:?} \
         after the cut with token {} (the holder's {})",
        lost_at - cut_at,
        taken_at - cut_at,
        taken.fencing_token(),
        guard.fencing_token(),
    );
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost:?}");
    assert!(
        lost_at < taken_at,
        "granted elsewhere {:?} before the holder learnt it had lost it",
        lost_at - taken_at
    );
    assert!(taken.fencing_token() > guard.fencing_token());
    taken.release().await.unwrap();
}

/// The reply to the create of a waiter's node is lost (the proxy drops it and resets the
/// connection): the client finds the node it made on its session instead of making a second
/// one, so the queue holds exactly one node of it, the lock is granted without a stall, and
/// nothing is left once it is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_create_reply_leaves_exactly_one_node_and_no_stall() {
    let ensemble = ZkEnsemble::start(3);
    let proxy = FaultProxy::start_framed(
        ([127, 0, 0, 1], ensemble.client_port(0)).into(),
        Framing::LengthPrefixed,
    )
    .await;
    let backend = backend(
        &format!("zookeeper://{}", proxy.addr()),
        Duration::from_secs(5),
    );
    backend.ping().await.unwrap();
    let client = connect(&ensemble).await;
    let queue = format!("/{PREFIX}/lost-create");
    // The create's reply names the new node's path; no other reply of the test does.
    proxy.drop_next_reply_matching(format!("{queue}/").as_bytes(), true);
    let started = Instant::now();
    let guard = Lock::new("lost-create")
        .on(&backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!(proxy.dropped().await, 1, "the create's reply was lost");
    let nodes = client.list_children(&queue).await.unwrap();
    eprintln!(
        "ZOOKEEPER lost create reply: granted {took:?} after the acquire began; nodes in the \
         queue while held: {nodes:?}"
    );
    assert_eq!(nodes.len(), 1, "exactly one node: {nodes:?}");
    assert!(took < Duration::from_secs(5), "stalled {took:?}");
    guard.release().await.unwrap();
    let empty = until_on_zookeeper(&ensemble, Duration::from_secs(5), async || {
        client
            .list_children(&queue)
            .await
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    assert!(
        empty,
        "a node was left behind: {:?}",
        client.list_children(&queue).await
    );
}

/// With two of three servers down, nothing can be committed: a call fails within its wait
/// budget (plus a response timeout) with a backend error naming the ensemble, and a holder
/// learns from its own clock that its lease is gone before ZooKeeper could hand it to anyone.
/// Started again, the ensemble serves locks again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_majority_down_calls_fail_within_their_budget() {
    let mut ensemble = ZkEnsemble::start(3);
    let lease = Duration::from_secs(2);
    let backend = backend(&ensemble.url(), lease);
    let held = Lock::new("held").on(&backend).acquire().await.unwrap();
    let leader = ensemble.leader();
    let down = [(leader + 1) % 3, (leader + 2) % 3];
    for server in down {
        ensemble.kill(server);
    }
    let killed_at = Instant::now();

    let budget = Duration::from_secs(2);
    let started = Instant::now();
    let acquire = Lock::new("other").on(&backend).wait(budget).acquire();
    let (acquired, lost) = tokio::join!(
        async { (acquire.await, started.elapsed()) },
        tokio::time::timeout(lease * 2, async {
            let lost = held.lost().await;
            (lost, killed_at.elapsed())
        })
    );
    let (err, failed_after) = (acquired.0.unwrap_err(), acquired.1);
    let (lost, lost_after) = lost.expect("the holder learns its lease is gone");
    eprintln!(
        "ZOOKEEPER majority down: an acquire with a {budget:?} wait failed after \
         {failed_after:?}: {err}; the holder of a {lease:?} lease learnt it lost it \
         {lost_after:?} after the kill"
    );
    assert!(
        matches!(err, LockError::Backend(_)),
        "a backend error: {err:?}"
    );
    assert!(
        err.to_string().contains("ZooKeeper"),
        "names the ensemble: {err}"
    );
    assert!(
        failed_after < budget + Duration::from_millis(1500),
        "the call outlived its wait budget: {failed_after:?}"
    );
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost:?}");
    assert!(lost_after <= lease, "told only after {lost_after:?}");

    for server in down {
        ensemble.restart(server);
    }
    let again = Lock::new("other")
        .on(&backend)
        .wait(Duration::from_secs(20))
        .acquire()
        .await;
    assert!(again.is_ok(), "the ensemble serves locks again: {again:?}");
}

/// Five processes wait for one key, queued in the order they came: each release wakes only
/// the next in line (a watch of its predecessor's node), which takes the lock — FIFO across
/// processes, and no waiter asks again for a release that was not its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_one_at_a_time_in_queue_order() {
    let ensemble = ZkEnsemble::start(3);
    let holder = backend(&ensemble.url(), Duration::from_secs(30));
    let held = Lock::new("line").on(&holder).acquire().await.unwrap();
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    let mut backends = Vec::new();
    for place in 0..5u64 {
        let waiter = backend(&ensemble.url(), Duration::from_secs(30));
        let (task_backend, order_tx) = (waiter.clone(), order_tx.clone());
        waiters.push(tokio::spawn(async move {
            let guard = Lock::new("line")
                .on(&task_backend)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
                .unwrap();
            order_tx.send(place).unwrap();
            guard.release().await.unwrap();
        }));
        // In line once the queue holds its entry: the next one joins behind it.
        let queued = until_on_zookeeper(&ensemble, Duration::from_secs(5), async || {
            let holder = holder.inspect("line").await.unwrap();
            holder.and_then(|holder| holder.waiting) == Some(place + 1)
        })
        .await;
        assert!(queued, "waiter {place} never queued");
        backends.push(waiter);
    }
    held.release().await.unwrap();
    for waiter in waiters {
        waiter.await.unwrap();
    }
    let mut served = Vec::new();
    while let Ok(place) = order.try_recv() {
        served.push(place);
    }
    let asked: Vec<u64> = backends.iter().map(|b| b.stats().busy_replies).collect();
    eprintln!("ZOOKEEPER queue: served in order {served:?}; busy replies per waiter {asked:?}");
    assert_eq!(served, [0, 1, 2, 3, 4], "FIFO across processes");
    // Its first request, and the one after it watched the queue; then only its turn.
    assert!(
        asked.iter().all(|&busy| busy == 2),
        "a waiter asked again for a release that was not its turn: {asked:?}"
    );
}

/// One server cut off from the client (its connection through the fault proxy blackholed:
/// requests sent there are never answered): the client moves its session to another server and
/// locks go on, each call within its wait budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_from_the_client_does_not_stop_locks() {
    let ensemble = ZkEnsemble::start(3);
    let (url, proxies) = proxied(&ensemble).await;
    let backend = backend(&url, Duration::from_millis(1500));
    for i in 0..10 {
        Lock::new(format!("before-{i}"))
            .on(&backend)
            .run(async {})
            .await
            .unwrap();
    }
    // The one the session is on: the proxy with a connection.
    let current = proxies
        .iter()
        .position(|proxy| proxy.connections() > 0)
        .expect("the session is on one server");
    proxies[current].blackhole(true);
    let budget = Duration::from_secs(5);
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let done = Lock::new(format!("cut-{i}"))
            .on(&backend)
            .wait(budget)
            .run(async {})
            .await;
        slowest = slowest.max(started.elapsed());
        assert!(done.is_ok(), "cycle {i} with a server cut off: {done:?}");
    }
    let stats = backend.stats();
    eprintln!(
        "ZOOKEEPER server cut off: 20 lock cycles after the session's server was cut off, the \
         slowest {slowest:?}; {} requests held by the blackholed proxy",
        proxies[current].requests_held()
    );
    assert!(slowest < budget, "a cycle took {slowest:?}");
    assert!(stats.acquired >= 30, "{stats:?}");
}
