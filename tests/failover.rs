//! The failover comparison: the same workload and the same fault on Sentinel without
//! `min_replicas`, on Sentinel with `min_replicas(1)`, on a 3-member etcd cluster, on a
//! 3-server ZooKeeper ensemble, and on
//! PostgreSQL with a streaming standby, asynchronous and synchronous (`synchronous_standby_names`),
//! counting the double grants a fenced resource sees.
//!
//! Each round, the servers that would take over stop receiving what the primary (or leader)
//! writes — the replicas, or etcd's or ZooKeeper's followers, are paused; PostgreSQL's standby is cut off — and
//! a long holder asks for the key that other clients keep contending for. Then the primary
//! (leader) is killed, the paused servers resume, and one of them takes over (the standby is
//! promoted, and the address the clients use moves to it); the holder keeps the lock a moment
//! longer while the contenders go on asking. A double grant is a round in which the resource
//! saw a contender inside while the holder was (an overlap), or fenced out a holder's write
//! because a newer token had written first. The holder does not look at its guard, as code that
//! ignores a lost lock would not: on Sentinel and an asynchronous standby that is what the
//! lost grant costs. The consensus stores are held to the property itself: no round in which
//! two leases overlapped while both were valid — a contender let in while the holder's lease
//! had not run out, or the holder's write fenced out while it had not. A holder whose lease ran
//! out inside (a ZooKeeper election longer than what was left of it lets no renewal through)
//! holds nothing; it is counted apart. The killed server is started again (PostgreSQL: a
//! new standby attached) before the next round.
//!
//! Figures are printed as a `FAILOVER …` table on stderr.

mod common;

use common::worker;
use common::PREFIX;
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError, LockGuard};
use distlock_test_support::{
    EtcdCluster, FaultProxy, PgServer, RedisServer, SentinelGroup, ZkEnsemble,
};
use redis::AsyncCommands;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: usize = 4;
/// Clients contending besides the holder, each its own backend (as another process would be),
/// with this many tasks each.
const CONTENDERS: usize = 2;
const TASKS: usize = 3;
/// How long the holder keeps the lock once the new primary (leader) serves: the contenders'
/// chance to be granted it too.
const HOLD_AFTER_FAILOVER: Duration = Duration::from_millis(500);
const DOWN_AFTER: Duration = Duration::from_millis(500);
/// The PostgreSQL clients' watchdog lease.
const PG_LEASE: Duration = Duration::from_secs(2);

/// A deployment under the round's fault.
trait Deployment {
    fn name(&self) -> &'static str;
    fn backend(&self) -> Backend;
    /// The servers that would take over stop receiving the primary's (leader's) writes.
    fn lag(&mut self);
    /// Kills the primary (leader), resumes the lagging servers, and waits until one of them
    /// took over.
    fn kill_and_fail_over(&mut self) -> Duration;
    /// Starts the killed server again, part of the deployment once more.
    fn heal(&mut self);
    /// How long the holder keeps the lock once the new primary (leader) serves.
    fn hold_after_failover(&self) -> Duration {
        HOLD_AFTER_FAILOVER
    }
}

struct Sentinel {
    group: SentinelGroup,
    min_replicas: u32,
}

impl Deployment for Sentinel {
    fn name(&self) -> &'static str {
        match self.min_replicas {
            0 => "Sentinel",
            _ => "Sentinel, min_replicas(1)",
        }
    }

    fn backend(&self) -> Backend {
        let builder = Backend::builder(self.group.sentinel_url())
            .prefix(PREFIX)
            .watchdog_lease(Duration::from_secs(10));
        match self.min_replicas {
            0 => builder,
            n => builder
                .min_replicas(n)
                .replica_timeout(Duration::from_millis(200)),
        }
        .build()
        .unwrap()
    }

    fn lag(&mut self) {
        self.group.pause_replicas();
    }

    fn kill_and_fail_over(&mut self) -> Duration {
        self.group.kill_lagging_primary_and_wait_failover()
    }

    fn heal(&mut self) {
        self.group.restart_killed();
    }
}

struct Etcd {
    cluster: EtcdCluster,
    leader: usize,
}

impl Deployment for Etcd {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn backend(&self) -> Backend {
        Backend::builder(self.cluster.url())
            .prefix(PREFIX)
            .watchdog_lease(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    fn lag(&mut self) {
        self.leader = self.cluster.leader();
        for follower in self.followers() {
            self.cluster.pause(follower);
        }
    }

    fn kill_and_fail_over(&mut self) -> Duration {
        let killed_at = Instant::now();
        self.cluster.kill(self.leader);
        for follower in self.followers() {
            self.cluster.resume(follower);
        }
        self.cluster.leader();
        killed_at.elapsed()
    }

    fn heal(&mut self) {
        self.cluster.restart(self.leader);
    }
}

impl Etcd {
    fn followers(&self) -> [usize; 2] {
        [(self.leader + 1) % 3, (self.leader + 2) % 3]
    }
}

struct Zookeeper {
    ensemble: ZkEnsemble,
    leader: usize,
}

impl Deployment for Zookeeper {
    fn name(&self) -> &'static str {
        "ZooKeeper"
    }

    fn backend(&self) -> Backend {
        Backend::builder(self.ensemble.url())
            .prefix(PREFIX)
            .watchdog_lease(Duration::from_secs(10))
            .build()
            .unwrap()
    }

    fn lag(&mut self) {
        self.leader = self.ensemble.leader();
        for follower in [(self.leader + 1) % 3, (self.leader + 2) % 3] {
            self.ensemble.pause(follower);
        }
    }

    fn kill_and_fail_over(&mut self) -> Duration {
        let killed_at = Instant::now();
        self.ensemble.kill(self.leader);
        for follower in [(self.leader + 1) % 3, (self.leader + 2) % 3] {
            self.ensemble.resume(follower);
        }
        self.ensemble.leader();
        killed_at.elapsed()
    }

    fn heal(&mut self) {
        self.ensemble.restart(self.leader);
    }
}

/// PostgreSQL with one streaming standby, behind a proxy that moves to the promoted standby
/// (a virtual IP, as an HA manager moves it). The standby is cut off from the primary
/// (`detach`) to lag; the primary is killed, the standby promoted, the proxy moved, and a new
/// standby attached to the new primary (with the same name, so that a synchronous setting
/// names it too).
struct PgStreaming {
    primary: PgServer,
    standby: PgServer,
    proxy: FaultProxy,
    synchronous: bool,
}

impl PgStreaming {
    fn start(synchronous: bool) -> PgStreaming {
        let primary = PgServer::start();
        primary.psql(&distlock::postgres::schema(common::postgres::SCHEMA).unwrap());
        if synchronous {
            // After the schema (a commit with no standby yet would wait for ever), before the
            // standby copies the settings: every later primary has it too.
            primary.psql("ALTER SYSTEM SET synchronous_standby_names = 'standby'");
            primary.psql("SELECT pg_reload_conf()");
        }
        let standby = PgServer::standby_of(&primary, "standby");
        let proxy = worker::runtime().block_on(FaultProxy::start(primary.addr()));
        PgStreaming {
            primary,
            standby,
            proxy,
            synchronous,
        }
    }
}

impl Deployment for PgStreaming {
    fn name(&self) -> &'static str {
        match self.synchronous {
            false => "PostgreSQL, asynchronous standby",
            true => "PostgreSQL, synchronous standby",
        }
    }

    fn backend(&self) -> Backend {
        let url = format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.proxy.addr().port()
        );
        Backend::builder(url)
            .prefix(PREFIX)
            .watchdog_lease(PG_LEASE)
            .build()
            .unwrap()
    }

    fn lag(&mut self) {
        self.standby.detach();
    }

    /// The queue the promoted standby has is the one it had when it was cut off: the entries
    /// of contenders that have moved on since stay until their leases run out, and keep the
    /// others waiting meanwhile. The holder stays a lease longer, so that they can be granted
    /// the lock while it is inside if its grant was lost.
    fn hold_after_failover(&self) -> Duration {
        PG_LEASE + HOLD_AFTER_FAILOVER
    }

    fn kill_and_fail_over(&mut self) -> Duration {
        let killed_at = Instant::now();
        self.primary.kill();
        self.standby.promote();
        self.proxy.retarget(self.standby.addr());
        let failover = killed_at.elapsed();
        let standby = PgServer::standby_of(&self.standby, "standby");
        self.primary = std::mem::replace(&mut self.standby, standby);
        failover
    }

    /// The killed primary was replaced by a new standby already.
    fn heal(&mut self) {}
}

/// What the rounds on one deployment came to.
#[derive(Debug, Default)]
struct Outcome {
    rounds_with_double_grants: usize,
    /// Rounds with an overlap, or a fenced-out write, while both leases were valid.
    rounds_granted_twice_while_valid: usize,
    /// Rounds in which the holder's lease had run out (or was found lost) by the time it left.
    holder_lapsed: usize,
    overlaps: u64,
    rejected: u64,
    contender_sections: u64,
    failover: Duration,
}

/// The resource both the holder and the contenders write to: `inside` counts who is in a
/// section, and the fence orders their writes by token.
#[derive(Clone)]
struct Resource {
    redis: redis::aio::MultiplexedConnection,
    fenced: Arc<FencedStore>,
    /// The long holder's guard while it is inside.
    holder: Arc<std::sync::Mutex<Option<Arc<LockGuard>>>>,
    overlaps: Arc<AtomicU64>,
    rejected: Arc<AtomicU64>,
    /// Overlaps and fenced-out writes while both leases were valid.
    while_valid: Arc<AtomicU64>,
}

impl Resource {
    async fn open(server: &RedisServer) -> Resource {
        let client = redis::Client::open(server.url()).unwrap();
        Resource {
            redis: client.get_multiplexed_async_connection().await.unwrap(),
            fenced: Arc::new(FencedStore::open(&server.url()).unwrap()),
            holder: Arc::default(),
            overlaps: Arc::default(),
            rejected: Arc::default(),
            while_valid: Arc::default(),
        }
    }

    async fn enter(&mut self) {
        let inside: i64 = self.redis.incr("inside", 1).await.unwrap();
        if inside != 1 {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
            // A holder inside whose lease has run out holds nothing.
            let holder_lapsed = self
                .holder
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|guard| !guard.is_held());
            if inside - i64::from(holder_lapsed) > 1 {
                self.while_valid.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The long holder enters, its guard known to the contenders that come in after it.
    async fn enter_holding(&mut self, guard: &Arc<LockGuard>) {
        *self.holder.lock().unwrap() = Some(guard.clone());
        self.enter().await;
    }

    async fn leave(&mut self, token: u64) {
        self.write(token, true).await;
        let _: i64 = self.redis.decr("inside", 1).await.unwrap();
    }

    /// The fenced write, `valid` if its writer's lease had not run out.
    async fn write(&mut self, token: u64, valid: bool) {
        let written = self.fenced.write("fenced", token, b"x").await.unwrap();
        if written != FencedWrite::Applied {
            self.rejected.fetch_add(1, Ordering::SeqCst);
            if valid {
                self.while_valid.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// The long holder leaves: the fenced write, then out (and its guard no longer known).
    /// What its guard said as it wrote: `Ok` while its lease was valid.
    async fn leave_holding(&mut self, guard: &LockGuard) -> Result<(), LockError> {
        let checked = guard.check();
        self.write(guard.fencing_token(), checked.is_ok()).await;
        let _: i64 = self.redis.decr("inside", 1).await.unwrap();
        self.holder.lock().unwrap().take();
        checked
    }
}

/// Short sections on `counter` until `stop`; a failed call (the wait budget spent on a dead
/// primary, a grant no replica acknowledged) just asks again.
async fn contend(backend: Backend, mut resource: Resource, stop: Arc<AtomicBool>) -> u64 {
    let mut sections = 0;
    while !stop.load(Ordering::SeqCst) {
        let done = Lock::new("counter")
            .on(&backend)
            .wait(Duration::from_secs(5))
            .run(async {
                resource.enter().await;
                tokio::task::yield_now().await;
                resource.leave(distlock::fencing_token().unwrap()).await;
            })
            .await;
        sections += u64::from(done.is_ok());
    }
    sections
}

/// The long holder: takes `counter` (asking again until it is granted), enters, says so, and
/// leaves when told, without looking at its guard; what its guard said then, and its token.
async fn hold(
    backend: Backend,
    mut resource: Resource,
    entered: tokio::sync::oneshot::Sender<()>,
    leave: tokio::sync::oneshot::Receiver<()>,
) -> (Result<(), LockError>, u64) {
    let guard = loop {
        match Lock::new("counter")
            .on(&backend)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
        {
            Ok(guard) => break guard,
            Err(LockError::ReplicasNotAcknowledged { .. } | LockError::Backend(_)) => continue,
            Err(err) => panic!("the holder: {err}"),
        }
    };
    let guard = Arc::new(guard);
    resource.enter_holding(&guard).await;
    let _ = entered.send(());
    let _ = leave.await;
    let checked = resource.leave_holding(&guard).await;
    let guard = Arc::into_inner(guard).expect("the resource let the guard go");
    let token = guard.fencing_token();
    let _ = guard.release().await;
    (checked, token)
}

fn run_rounds(deployment: &mut dyn Deployment) -> Outcome {
    let runtime = worker::runtime();
    let server = RedisServer::start();
    let resource = runtime.block_on(Resource::open(&server));
    let stop = Arc::new(AtomicBool::new(false));
    let mut contenders = Vec::new();
    for _ in 0..CONTENDERS {
        let backend = deployment.backend();
        for _ in 0..TASKS {
            let (backend, resource, stop) = (backend.clone(), resource.clone(), stop.clone());
            contenders.push(runtime.spawn(contend(backend, resource, stop)));
        }
    }
    let holder_backend = deployment.backend();
    let mut outcome = Outcome::default();
    for round in 1..=ROUNDS {
        let (overlaps, rejected, while_valid) = (
            resource.overlaps.load(Ordering::SeqCst),
            resource.rejected.load(Ordering::SeqCst),
            resource.while_valid.load(Ordering::SeqCst),
        );
        deployment.lag();
        let (entered_tx, entered) = tokio::sync::oneshot::channel();
        let (leave, leave_rx) = tokio::sync::oneshot::channel();
        let holder = runtime.spawn(hold(
            holder_backend.clone(),
            resource.clone(),
            entered_tx,
            leave_rx,
        ));
        // Unreplicated, the holder is granted at once; waiting for replicas (or a quorum),
        // it is not before the failover. Either way the fault comes while it asks or holds.
        let entered = runtime.block_on(async {
            let mut entered = entered;
            let early = tokio::time::timeout(Duration::from_millis(300), &mut entered).await;
            (early.is_ok(), entered)
        });
        let failover = deployment.kill_and_fail_over();
        outcome.failover = outcome.failover.max(failover);
        runtime.block_on(async {
            if !entered.0 {
                tokio::time::timeout(Duration::from_secs(30), entered.1)
                    .await
                    .expect("the holder got the lock after the failover")
                    .unwrap();
            }
            // Holding is the point: the contenders ask meanwhile.
            tokio::time::sleep(deployment.hold_after_failover()).await;
        });
        let _ = leave.send(());
        let (checked, token) = runtime.block_on(holder).unwrap();
        outcome.holder_lapsed += usize::from(checked.is_err());
        let doubled = resource.overlaps.load(Ordering::SeqCst) > overlaps
            || resource.rejected.load(Ordering::SeqCst) > rejected;
        outcome.rounds_with_double_grants += usize::from(doubled);
        let twice = resource.while_valid.load(Ordering::SeqCst) - while_valid;
        outcome.rounds_granted_twice_while_valid += usize::from(twice > 0);
        if doubled {
            eprintln!(
                "FAILOVER {} round {round}: the holder (token {token}) was granted {} the kill; \
                 {} overlaps and fenced-out writes, {twice} of them with both leases valid; \
                 as it left, its guard said {checked:?}",
                deployment.name(),
                if entered.0 { "before" } else { "after" },
                resource.overlaps.load(Ordering::SeqCst) - overlaps
                    + resource.rejected.load(Ordering::SeqCst)
                    - rejected,
            );
        }
        deployment.heal();
    }
    stop.store(true, Ordering::SeqCst);
    for contender in contenders {
        outcome.contender_sections += runtime.block_on(contender).unwrap();
    }
    outcome.overlaps = resource.overlaps.load(Ordering::SeqCst);
    outcome.rejected = resource.rejected.load(Ordering::SeqCst);
    outcome
}

/// Runs the rounds on each deployment and prints the table's rows.
fn compare(deployments: &mut [Box<dyn Deployment>]) -> Vec<(&'static str, Outcome)> {
    let mut table = String::from(
        "FAILOVER | deployment | rounds with a double grant | overlaps | fenced writes \
         rejected | of them with both leases valid | holder's lease ran out | contender sections \
         | longest failover\n",
    );
    let mut outcomes = Vec::new();
    for deployment in deployments.iter_mut() {
        let outcome = run_rounds(deployment.as_mut());
        table.push_str(&format!(
            "FAILOVER | {} | {} of {ROUNDS} | {} | {} | {} of {ROUNDS} | {} of {ROUNDS} | {} | {:?}\n",
            deployment.name(),
            outcome.rounds_with_double_grants,
            outcome.overlaps,
            outcome.rejected,
            outcome.rounds_granted_twice_while_valid,
            outcome.holder_lapsed,
            outcome.contender_sections,
            outcome.failover,
        ));
        outcomes.push((deployment.name(), outcome));
    }
    eprint!("{table}");
    for (name, outcome) in &outcomes {
        assert!(
            outcome.contender_sections > 0,
            "{name}: the contenders never got the lock, so they could not be granted it twice"
        );
    }
    outcomes
}

#[test]
fn failovers_double_grant_on_sentinel_and_never_on_etcd_or_zookeeper() {
    let outcomes = compare(&mut [
        Box::new(Sentinel {
            group: SentinelGroup::start_with_replicas(2, DOWN_AFTER),
            min_replicas: 0,
        }),
        Box::new(Sentinel {
            group: SentinelGroup::start_with_replicas(2, DOWN_AFTER),
            min_replicas: 1,
        }),
        Box::new(Etcd {
            cluster: EtcdCluster::start(3),
            leader: 0,
        }),
        Box::new(Zookeeper {
            ensemble: ZkEnsemble::start(3),
            leader: 0,
        }),
    ]);
    for (name, consensus) in &outcomes[2..] {
        assert_eq!(
            consensus.rounds_granted_twice_while_valid, 0,
            "{name} granted a lock twice: {consensus:?}"
        );
    }
    let sentinel = &outcomes[0].1;
    assert!(
        sentinel.rounds_with_double_grants > 0,
        "the fault did not bite: Sentinel without replica acknowledgement lost no grant \
         ({sentinel:?}), so the comparison shows nothing"
    );
}

/// A grant the primary acknowledged before its standby had it is lost when the standby is
/// promoted; with `synchronous_standby_names`, no grant is acknowledged before the standby has
/// it.
#[test]
fn failovers_double_grant_on_an_asynchronous_standby_and_never_on_a_synchronous_one() {
    let outcomes = compare(&mut [
        Box::new(PgStreaming::start(false)),
        Box::new(PgStreaming::start(true)),
    ]);
    let synchronous = &outcomes[1].1;
    assert_eq!(
        synchronous.rounds_granted_twice_while_valid, 0,
        "PostgreSQL with a synchronous standby granted a lock twice: {synchronous:?}"
    );
    let asynchronous = &outcomes[0].1;
    assert!(
        asynchronous.rounds_with_double_grants > 0,
        "the fault did not bite: the asynchronous standby lost no grant ({asynchronous:?}), so \
         the comparison shows nothing"
    );
}
