//! The ZooKeeper engine under faults, on a real 3-server ensemble started per test: the tests
//! written once for etcd and ZooKeeper (`consensus_faults`: the leader killed and a follower
//! paused under load from several processes, a holder paused past its session, the majority of
//! servers down, waiters woken in queue order), called here on ZooKeeper under their names, and
//! ZooKeeper's own: a holder cut off from every server, a create whose reply is lost, a server
//! cut off from the client, a lease the session cannot cover, a release lost with its
//! connection.
//!
//! Figures are printed as `ZOOKEEPER …` lines on stderr.

mod common;
mod consensus_faults;

use common::zookeeper::{connect, until_on_zookeeper};
use common::PREFIX;
use consensus_faults::{backend, HOLDER_LEASE};
use distlock::{Lock, LostReason};
use distlock_test_support::{FaultProxy, Framing, ZkEnsemble};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = common::worker::role() else {
        return;
    };
    common::worker::runtime().block_on(consensus_faults::play(&role));
}

consensus_faults::tests_on!(ZkEnsemble);

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
    // One server, whose first session in a fresh JVM may take over the default second.
    let backend = distlock::Backend::builder(format!("zookeeper://{}", proxy.addr()))
        .prefix(PREFIX)
        .watchdog_lease(Duration::from_secs(5))
        .connect_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
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

/// One server cut off from the client (its connection through the fault proxy blackholed:
/// requests sent there are never answered): the client moves its session to another server and
/// locks go on, each call within its wait budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_cut_off_from_the_client_does_not_stop_locks() {
    let ensemble = ZkEnsemble::start(3);
    let (url, proxies) = proxied(&ensemble).await;
    let backend = backend(&url, Duration::from_millis(1500));
    let budget = Duration::from_secs(5);
    consensus_faults::cycles(&backend, "before", 10, budget).await;
    // The one the session is on: the proxy with a connection.
    let current = proxies
        .iter()
        .position(|proxy| proxy.connections() > 0)
        .expect("the session is on one server");
    proxies[current].blackhole(true);
    let slowest = consensus_faults::cycles(&backend, "cut", 20, budget).await;
    let stats = backend.stats();
    eprintln!(
        "ZOOKEEPER server cut off: 20 lock cycles after the session's server was cut off, the \
         slowest {slowest:?}; {} requests held by the blackholed proxy",
        proxies[current].requests_held()
    );
    assert!(stats.acquired >= 30, "{stats:?}");
}

/// A session shorter than the lease would let ZooKeeper end a cut-off holder's session, and
/// grant its lock elsewhere, while the holder still counts on its lease: such a lease is refused
/// with an error that names the session and what to change, and `doctor` says the same of the
/// watchdog's lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_the_session_cannot_cover_is_refused_and_the_doctor_says_so() {
    let ensemble = ZkEnsemble::start(3);
    let url = format!("{}?session_timeout=2s", ensemble.url());
    let backend = backend(&url, Duration::from_secs(30));
    let findings = backend.doctor().await.unwrap();
    eprintln!("ZOOKEEPER short session: doctor {findings:?}");
    assert!(
        findings
            .iter()
            .any(|f| f.check == distlock::Check::Session && f.advice.contains("?session_timeout=")),
        "{findings:?}"
    );
    let refused = Lock::new("long").on(&backend).acquire().await.unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("outlives what the ZooKeeper session covers"),
        "{refused}"
    );
    // A lease within three quarters of the session is taken.
    let fits = Lock::new("short")
        .on(&backend)
        .lease(distlock::Lease::Fixed(Duration::from_millis(1500)))
        .acquire()
        .await
        .unwrap();
    fits.release().await.unwrap();
}

/// A release whose delete is lost with its connection (held by a blackholed proxy, then the
/// connection reset) keeps its entry known, and once the session is back the background release
/// deletes it — long before its lease would end (the ten-second lease here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_lost_with_its_connection_completes_once_the_session_is_back() {
    let ensemble = ZkEnsemble::start(3);
    let (url, proxies) = proxied(&ensemble).await;
    let backend = backend(&url, Duration::from_secs(10));
    let guard = Lock::new("cut-release")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    for proxy in &proxies {
        proxy.blackhole(true);
    }
    let released = guard.release().await;
    eprintln!("ZOOKEEPER release cut off: {released:?}");
    // The delete never reaches a server: it dies with the connection.
    for proxy in &proxies {
        proxy.reset_all();
        proxy.blackhole(false);
    }
    let healed_at = Instant::now();
    let client = connect(&ensemble).await;
    let queue = format!("/{PREFIX}/cut-release");
    let empty = until_on_zookeeper(&ensemble, Duration::from_secs(5), async || {
        client
            .list_children(&queue)
            .await
            .unwrap_or_default()
            .is_empty()
    })
    .await;
    eprintln!(
        "ZOOKEEPER release cut off: the entry gone {:?} after the connection came back; {:?}",
        healed_at.elapsed(),
        backend.stats()
    );
    assert!(
        empty,
        "the entry stayed: {:?}",
        client.list_children(&queue).await
    );
    assert!(healed_at.elapsed() < Duration::from_secs(5));
}
