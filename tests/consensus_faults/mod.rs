//! The etcd and ZooKeeper engines under faults, written once: each test body and worker role
//! here runs on either [`Ensemble`], and tests/etcd.rs and tests/zookeeper.rs run every test here
//! on theirs ([`tests_on`]), under the body's name: the leader killed and a follower paused under
//! load from several processes, a holder paused past its lease, the majority of servers down,
//! waiters woken one at a time in queue order. A separate Redis (the resource) records the
//! sections of the multi-process tests and fences their writes.
//!
//! Figures are printed on stderr as lines that begin with the store's name
//! ([`Ensemble::FIGURES`]).

use crate::common::etcd::until_on_etcd;
use crate::common::sections::{self, Tally};
use crate::common::worker::{self, Worker};
use crate::common::zookeeper::until_on_zookeeper;
use crate::common::PREFIX;
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError, LostReason};
use distlock_test_support::{EtcdCluster, RedisServer, ZkEnsemble};
use std::future::Future;
use std::time::{Duration, Instant};

/// The worker processes of the multi-process tests.
pub const PROCESSES: usize = 3;
/// The paused holder's watchdog lease.
pub const HOLDER_LEASE: Duration = Duration::from_secs(1);

/// A consensus store's servers on loopback, as the tests here break them.
pub trait Ensemble: Sized {
    /// What its figures' lines begin with (`ETCD`).
    const FIGURES: &'static str;
    /// How its errors name it.
    const NAMED: &'static str;
    fn start(size: usize) -> Self;
    fn url(&self) -> String;
    /// The server that leads, waiting for an election under way.
    fn leader(&self) -> usize;
    fn kill(&mut self, i: usize);
    fn restart(&mut self, i: usize);
    fn pause(&self, i: usize);
    fn resume(&self, i: usize);
    /// Waits up to `within` until `check` holds, re-checked at every change the store makes.
    fn until(
        &self,
        within: Duration,
        check: impl AsyncFnMut() -> bool,
    ) -> impl Future<Output = bool>;
}

impl Ensemble for EtcdCluster {
    const FIGURES: &'static str = "ETCD";
    const NAMED: &'static str = "etcd";
    fn start(size: usize) -> Self {
        EtcdCluster::start(size)
    }
    fn url(&self) -> String {
        EtcdCluster::url(self)
    }
    fn leader(&self) -> usize {
        EtcdCluster::leader(self)
    }
    fn kill(&mut self, i: usize) {
        EtcdCluster::kill(self, i)
    }
    fn restart(&mut self, i: usize) {
        EtcdCluster::restart(self, i)
    }
    fn pause(&self, i: usize) {
        EtcdCluster::pause(self, i)
    }
    fn resume(&self, i: usize) {
        EtcdCluster::resume(self, i)
    }
    async fn until(&self, within: Duration, check: impl AsyncFnMut() -> bool) -> bool {
        until_on_etcd(self, within, check).await
    }
}

impl Ensemble for ZkEnsemble {
    const FIGURES: &'static str = "ZOOKEEPER";
    const NAMED: &'static str = "ZooKeeper";
    fn start(size: usize) -> Self {
        ZkEnsemble::start(size)
    }
    fn url(&self) -> String {
        ZkEnsemble::url(self)
    }
    fn leader(&self) -> usize {
        ZkEnsemble::leader(self)
    }
    fn kill(&mut self, i: usize) {
        ZkEnsemble::kill(self, i)
    }
    fn restart(&mut self, i: usize) {
        ZkEnsemble::restart(self, i)
    }
    fn pause(&self, i: usize) {
        ZkEnsemble::pause(self, i)
    }
    fn resume(&self, i: usize) {
        ZkEnsemble::resume(self, i)
    }
    async fn until(&self, within: Duration, check: impl AsyncFnMut() -> bool) -> bool {
        until_on_zookeeper(self, within, check).await
    }
}

/// A backend on `url` with the tests' prefix and a watchdog lease of `lease`.
pub fn backend(url: &str, lease: Duration) -> Backend {
    Backend::builder(url)
        .prefix(PREFIX)
        .watchdog_lease(lease)
        .build()
        .unwrap()
}

/// Runs `n` lock cycles on `backend`, on the keys `<name>-<i>`, each within `budget`, and
/// answers the slowest.
pub async fn cycles(backend: &Backend, name: &str, n: usize, budget: Duration) -> Duration {
    let mut slowest = Duration::ZERO;
    for i in 0..n {
        let started = Instant::now();
        let done = Lock::new(format!("{name}-{i}"))
            .on(backend)
            .wait(budget)
            .run(async {})
            .await;
        slowest = slowest.max(started.elapsed());
        assert!(done.is_ok(), "cycle {i} of `{name}`: {done:?}");
    }
    assert!(slowest < budget, "a cycle of `{name}` took {slowest:?}");
    slowest
}

/// Plays the worker `role` the tests here spawn.
pub async fn play(role: &str) {
    match role {
        "sections" => sections::run().await,
        "hold" => hold().await,
        other => panic!("unknown worker role {other}"),
    }
}

/// The tests here as `#[test]`s of the target that calls it, on the ensemble `$ensemble`, each
/// under its body's name.
macro_rules! tests_on {
    ($ensemble:ty) => {
        #[test]
        fn leader_killed_and_follower_paused_under_load_never_overlap_or_go_back() {
            $crate::consensus_faults::leader_killed_and_follower_paused_under_load::<$ensemble>();
        }
        #[test]
        fn a_paused_holder_wakes_up_lost_and_its_late_write_is_rejected() {
            $crate::consensus_faults::a_paused_holder_wakes_up_lost::<$ensemble>();
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn with_the_majority_down_calls_fail_within_their_budget() {
            $crate::consensus_faults::with_the_majority_down::<$ensemble>().await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn waiters_are_woken_one_at_a_time_in_queue_order() {
            $crate::consensus_faults::waiters_are_woken_in_queue_order::<$ensemble>().await;
        }
    };
}
pub(crate) use tests_on;

/// 3 processes × 4 tasks loop fenced sections on one key; a follower is paused for a while,
/// then the leader is killed and later started again. Every section completes, none overlaps,
/// no token goes back, the fence rejects nothing.
pub fn leader_killed_and_follower_paused_under_load<E: Ensemble>() {
    let mut ensemble = E::start(3);
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
        "{} faults under load: {PROCESSES} processes x {} tasks, {} sections; server \
         {follower} paused during sections {paused_at}..{}, leader {leader} killed after \
         {before_kill} ({new_leader} led {elected:?} later, 100 more sections {resumed:?} after \
         the kill); {} overlaps, {regressions} token regressions, {} fenced writes rejected, {} \
         errors",
        E::FIGURES,
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

/// A holder stopped (SIGSTOP) while its watchdog keeps a 1 s lease: another process takes the
/// lock only after the holder's own validity has ended (at least two thirds of the lease after
/// the stop: its last renewal was at most a third before), with a larger token; on SIGCONT the
/// holder's checkpoint says the lease expired and the fence rejects its late write.
pub fn a_paused_holder_wakes_up_lost<E: Ensemble>() {
    let ensemble = E::start(3);
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
        "{} pause: holder with a {HOLDER_LEASE:?} watchdog lease stopped; lock taken over after \
         {taken_after:?} with token {fresh} (the holder's {stale}); on SIGCONT its checkpoint \
         said `{checkpoint}`; its late write: {write}",
        E::FIGURES,
    );
    assert!(fresh > stale, "the new holder's token is larger");
    worker::assert_not_taken_within_validity(taken_after, HOLDER_LEASE);
    assert_eq!(checkpoint, "lost Some(Expired)");
    assert_eq!(
        write,
        format!("{:?}", FencedWrite::Rejected { highest: fresh })
    );
}

/// With two of three servers down, nothing can be committed: a call fails within its wait
/// budget (plus a response timeout) with a backend error naming the store, and a holder learns
/// from its own clock that its lease is gone before the store could hand it to anyone. Started
/// again, the servers serve locks again.
pub async fn with_the_majority_down<E: Ensemble>() {
    let mut ensemble = E::start(3);
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
        "{} majority down: an acquire with a {budget:?} wait failed after {failed_after:?}: \
         {err}; the holder of a {lease:?} lease learnt it lost it {lost_after:?} after the kill",
        E::FIGURES,
    );
    assert!(
        matches!(err, LockError::Backend(_)),
        "a backend error: {err:?}"
    );
    assert!(err.to_string().contains(E::NAMED), "names the store: {err}");
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
    assert!(again.is_ok(), "the servers serve locks again: {again:?}");
}

/// Five processes wait for one key, queued in the order they came: each release wakes only
/// the next in line (its predecessor's deletion), which takes the lock — FIFO across
/// processes, and no waiter asks again for a release that was not its turn.
pub async fn waiters_are_woken_in_queue_order<E: Ensemble>() {
    let ensemble = E::start(3);
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
        let queued = ensemble
            .until(Duration::from_secs(5), async || {
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
    eprintln!(
        "{} queue: served in order {served:?}; busy replies per waiter {asked:?}",
        E::FIGURES
    );
    assert_eq!(served, [0, 1, 2, 3, 4], "FIFO across processes");
    // Its first request, and the one after it watched the queue; then only its turn.
    assert!(
        asked.iter().all(|&busy| busy == 2),
        "a waiter asked again for a release that was not its turn: {asked:?}"
    );
}
