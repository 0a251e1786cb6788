//! Fairness across processes: N worker processes (this binary again, see `common::worker`),
//! each with a few tasks, loop on one key for a few seconds; every section is a fenced
//! read-modify-write on a data server. Every process must get its share of the key (within
//! [`SHARE_BOUND`] of the mean), no call may run out of its wait budget, and no two sections may
//! overlap. Each cell prints a `FAIRNESS …` line on stderr with the shares and the worst wait.
//!
//! Regression: with one recorded next waiter per key, three or more processes starved all but
//! two of them (the two became each other's next waiter at every release).

mod common;

use common::worker::{self, Worker};
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError};
use distlock_test_support::{
    PgBouncer, PoolMode, RedisCluster, RedisServer, Reply, SentinelGroup, ServerConfig,
};
use redis::AsyncCommands;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Every process's share of the sections, as a ratio to the mean, lies within this of 1.
const SHARE_BOUND: f64 = 0.2;

/// How long each call may wait for the key: far beyond any fair wait, so that a call that runs
/// out of it was starved.
const WAIT_BUDGET: Duration = Duration::from_secs(20);

/// The cells of one engine run one after another (their timing is the point), and the engines'
/// matrices do not run side by side on this machine's cores.
static SERIAL: Mutex<()> = Mutex::new(());

/// One cell of the matrix: processes × tasks each, a section of this length, for this long.
#[derive(Debug, Clone, Copy)]
struct Cell {
    processes: usize,
    tasks: usize,
    section: Duration,
    run: Duration,
}

impl Cell {
    fn new(processes: usize, tasks: usize, section_ms: u64) -> Cell {
        Cell {
            processes,
            tasks,
            section: Duration::from_millis(section_ms),
            run: Duration::from_secs(3),
        }
    }
}

/// What one worker process counted.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    sections: u64,
    overlaps: u64,
    rejected: u64,
    busy: u64,
    errors: u64,
    worst_wait: Duration,
}

impl Tally {
    /// Adds `other`'s counts to these (the worst wait is the worse of the two).
    fn add(&mut self, other: Tally) {
        self.sections += other.sections;
        self.overlaps += other.overlaps;
        self.rejected += other.rejected;
        self.busy += other.busy;
        self.errors += other.errors;
        self.worst_wait = self.worst_wait.max(other.worst_wait);
    }

    fn parse(line: &str) -> Tally {
        let n: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        Tally {
            sections: n[0],
            overlaps: n[1],
            rejected: n[2],
            busy: n[3],
            errors: n[4],
            worst_wait: Duration::from_micros(n[5]),
        }
    }
}

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    match role.as_str() {
        "contend" => worker::runtime().block_on(contend()),
        "queue" => worker::runtime().block_on(wait_in_queue()),
        other => panic!("unknown worker role {other}"),
    }
}

fn env<T: std::str::FromStr>(name: &str) -> T
where
    T::Err: std::fmt::Debug,
{
    std::env::var(name).unwrap().parse().unwrap()
}

/// Loops sections on the key `fair` from `TASKS` tasks until `RUN_MS` has passed since the
/// parent's start line, and reports what it counted.
async fn contend() {
    let url: String = env("LOCK_URL");
    let data_url: String = env("DATA_URL");
    let tasks: usize = env("TASKS");
    let section = Duration::from_micros(env("SECTION_US"));
    let run = Duration::from_millis(env("RUN_MS"));
    let me: u32 = env("WORKER_INDEX");
    // Efficiency locks carry no token: their sections write the data unfenced (the overlap
    // and lost-update checks still see any double grant).
    let fenced_locks: bool = env("FENCED");
    let backend = Backend::builder(url)
        .prefix("fair")
        .min_replicas(env("MIN_REPLICAS"))
        .fencing_tokens(fenced_locks)
        .build()
        .unwrap();
    let fenced = std::sync::Arc::new(FencedStore::open(&data_url).unwrap());
    let client = redis::Client::open(data_url).unwrap();
    // Connect and load the scripts before the start line, so every worker starts at once.
    Lock::new(format!("warm-up-{me}"))
        .on(&backend)
        .run(async {})
        .await
        .unwrap();
    worker::ready_then_go().await;
    let deadline = Instant::now() + run;
    let mut handles = Vec::new();
    for _ in 0..tasks {
        let backend = backend.clone();
        let fenced = fenced.clone();
        let mut data = client.get_multiplexed_async_connection().await.unwrap();
        handles.push(tokio::spawn(async move {
            let mut tally = Tally::default();
            while Instant::now() < deadline {
                let asked = Instant::now();
                let mut waited = Duration::ZERO;
                let outcome = Lock::new("fair")
                    .on(&backend)
                    .wait(WAIT_BUDGET)
                    .run(async {
                        waited = asked.elapsed();
                        let inside: i64 = data.incr("inside", 1).await.unwrap();
                        let value: i64 = data.get("value").await.unwrap_or(0);
                        if !section.is_zero() {
                            tokio::time::sleep(section).await;
                        }
                        let token = distlock::fencing_token().unwrap();
                        let written = match fenced_locks {
                            true => fenced
                                .write("fenced", token, (value + 1).to_string().as_bytes())
                                .await
                                .unwrap(),
                            false => {
                                assert_eq!(token, 0, "an efficiency lock has no token");
                                FencedWrite::Applied
                            }
                        };
                        let _: () = data.set("value", value + 1).await.unwrap();
                        let _: i64 = data.decr("inside", 1).await.unwrap();
                        (inside != 1, written != FencedWrite::Applied)
                    })
                    .await;
                match outcome {
                    Ok((overlap, rejected)) => {
                        tally.sections += 1;
                        tally.overlaps += u64::from(overlap);
                        tally.rejected += u64::from(rejected);
                        tally.worst_wait = tally.worst_wait.max(waited);
                    }
                    Err(LockError::Busy { waited, .. }) => {
                        tally.busy += 1;
                        tally.worst_wait = tally.worst_wait.max(waited);
                    }
                    Err(err) => {
                        eprintln!("worker {me}: {err}");
                        tally.errors += 1;
                    }
                }
            }
            tally
        }));
    }
    let mut total = Tally::default();
    for handle in handles {
        total.add(handle.await.unwrap());
    }
    worker::report(
        "done",
        format!(
            "{} {} {} {} {} {}",
            total.sections,
            total.overlaps,
            total.rejected,
            total.busy,
            total.errors,
            total.worst_wait.as_micros()
        ),
    );
}

/// Where the lock lives for a matrix: the URL the workers build their backend from, and
/// `min_replicas`.
struct Deployment<'a> {
    name: &'a str,
    url: String,
    min_replicas: u32,
    /// Locks carry fencing tokens (`false`: efficiency locks).
    fenced: bool,
}

/// Runs `cells` one after another against the deployment `name` at `url`, the data (the
/// overlap check and the fenced resource) on a server of their own; asserts every cell, after
/// printing them all.
fn matrix(name: &str, url: String, min_replicas: u32, cells: &[Cell]) {
    matrix_of(
        Deployment {
            name,
            url,
            min_replicas,
            fenced: true,
        },
        cells,
    );
}

/// [`matrix`] for any deployment.
fn matrix_of(deployment: Deployment, cells: &[Cell]) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let data = RedisServer::start();
    let mut failures = Vec::new();
    for cell in cells {
        if let Err(failure) = run_cell(&deployment, &data, *cell) {
            failures.push(failure);
        }
    }
    assert!(
        failures.is_empty(),
        "unfair cells:\n{}",
        failures.join("\n")
    );
}

/// One cell: its figures printed, and what is wrong with them, if anything.
fn run_cell(deployment: &Deployment, data: &RedisServer, cell: Cell) -> Result<(), String> {
    data.command(&["FLUSHALL"]);
    let mut workers: Vec<Worker> = (0..cell.processes)
        .map(|i| {
            Worker::spawn(
                "worker_entry",
                "contend",
                &[
                    ("LOCK_URL", deployment.url.clone()),
                    ("DATA_URL", data.url()),
                    ("MIN_REPLICAS", deployment.min_replicas.to_string()),
                    ("FENCED", deployment.fenced.to_string()),
                    ("WORKER_INDEX", i.to_string()),
                    ("TASKS", cell.tasks.to_string()),
                    ("SECTION_US", cell.section.as_micros().to_string()),
                    ("RUN_MS", cell.run.as_millis().to_string()),
                ],
            )
        })
        .collect();
    worker::start_together(&mut workers);
    let tallies: Vec<Tally> = workers
        .iter()
        .map(|worker| Tally::parse(&worker.expect("done", cell.run + WAIT_BUDGET * 2)))
        .collect();
    for worker in &mut workers {
        assert!(worker.wait().success(), "a worker failed");
    }
    let sections: Vec<u64> = tallies.iter().map(|t| t.sections).collect();
    let total: u64 = sections.iter().sum();
    let mean = total as f64 / cell.processes as f64;
    let shares: Vec<f64> = sections.iter().map(|s| *s as f64 / mean).collect();
    let worst_wait = tallies.iter().map(|t| t.worst_wait).max().unwrap();
    let sum = |f: fn(&Tally) -> u64| tallies.iter().map(f).sum::<u64>();
    let (overlaps, rejected, busy, errors) = (
        sum(|t| t.overlaps),
        sum(|t| t.rejected),
        sum(|t| t.busy),
        sum(|t| t.errors),
    );
    let value: u64 = data
        .command(&["GET", "value"])
        .as_str()
        .map_or(0, |v| v.parse().unwrap());
    let lost_updates = total.saturating_sub(value);
    let shown: Vec<String> = shares.iter().map(|s| format!("{s:.2}")).collect();
    let line = format!(
        "FAIRNESS {} {}x{} {:?} sections: {sections:?} shares [{}] worst wait {worst_wait:?}; \
         {busy} out of budget, {errors} errors, {overlaps} overlaps, {lost_updates} lost \
         updates, {rejected} fenced writes rejected",
        deployment.name,
        cell.processes,
        cell.tasks,
        cell.section,
        shown.join(", ")
    );
    eprintln!("{line}");
    let unfair = shares.iter().any(|s| (s - 1.0).abs() > SHARE_BOUND);
    let unsafe_ = overlaps + lost_updates + rejected > 0;
    if unfair || busy > 0 || errors > 0 || unsafe_ || total == 0 {
        return Err(line);
    }
    Ok(())
}

/// The full matrix: 2, 3, 4 and 6 processes with 1, 2 and 4 tasks each, sections of 0 to 3 ms.
fn full_matrix() -> Vec<Cell> {
    let mut cells = Vec::new();
    for (i, processes) in [2, 3, 4, 6].into_iter().enumerate() {
        for (j, tasks) in [1, 2, 4].into_iter().enumerate() {
            cells.push(Cell::new(processes, tasks, ((i + j) % 4) as u64));
        }
    }
    cells
}

/// The smaller matrix for the replicated and sharded deployments.
fn small_matrix() -> Vec<Cell> {
    vec![Cell::new(3, 2, 1), Cell::new(4, 2, 0), Cell::new(6, 1, 2)]
}

#[test]
fn processes_share_a_key_fairly_on_one_server() {
    let server = RedisServer::start();
    matrix("redis", server.url(), 0, &full_matrix());
}

/// Efficiency locks (`fencing_tokens(false)`): first tries are `SET NX PX` claims, and the
/// queue keeps the processes in turn all the same.
#[test]
fn processes_share_a_key_fairly_with_efficiency_locks() {
    let server = RedisServer::start();
    let deployment = Deployment {
        name: "redis (efficiency locks)",
        url: server.url(),
        min_replicas: 0,
        fenced: false,
    };
    matrix_of(deployment, &small_matrix());
}

#[test]
fn processes_share_a_key_fairly_on_valkey() {
    let server = RedisServer::start_with(ServerConfig::new().valkey());
    matrix("valkey", server.url(), 0, &small_matrix());
}

/// Replica acknowledgement: a waiter handed the lock asks for it once more, and that grant is
/// acknowledged by the replica like any other.
#[test]
fn processes_share_a_key_fairly_on_sentinel_with_replica_acknowledgement() {
    let group = SentinelGroup::start(Duration::from_secs(5));
    matrix("sentinel", group.sentinel_url(), 1, &small_matrix());
}

#[test]
fn processes_share_a_key_fairly_on_a_cluster() {
    let cluster = RedisCluster::start(3, 0, Duration::from_secs(5));
    matrix("cluster", cluster.url(), 0, &small_matrix());
}

/// PostgreSQL: the queue engine's FIFO, woken by NOTIFY.
#[test]
fn processes_share_a_key_fairly_on_postgres() {
    let server = common::Postgres::server();
    matrix("postgres", server.url(), 0, &full_matrix());
}

/// PostgreSQL through PgBouncer in transaction mode: no LISTEN, so waiters poll on backoff —
/// and keep their places in the queue, so FIFO holds all the same.
#[test]
fn processes_share_a_key_fairly_on_postgres_through_pgbouncer_in_transaction_mode() {
    let server = common::Postgres::server();
    let bouncer = PgBouncer::start(&server, PoolMode::Transaction);
    matrix("postgres via pgbouncer", bouncer.url(), 0, &full_matrix());
}

/// MySQL (MariaDB): the queue engine's FIFO with no notification to wake a waiter — each backs
/// off, and keeps its place in the queue, so FIFO holds all the same.
#[test]
fn processes_share_a_key_fairly_on_mysql() {
    let server = common::Mysql::server();
    matrix("mysql", server.url(), 0, &full_matrix());
}

/// ZooKeeper: the queue engine's FIFO, each waiter woken by a watch of the node ahead of it.
#[test]
fn processes_share_a_key_fairly_on_zookeeper() {
    let ensemble = distlock_test_support::ZkEnsemble::start(3);
    matrix("zookeeper", ensemble.url(), 0, &full_matrix());
}

#[test]
fn processes_share_a_key_fairly_on_redlock() {
    let masters = RedisServer::start_many(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    matrix("redlock", urls.join(","), 0, &small_matrix());
}

/// Waits for the key `q` (one task), reports `acquired <token>`, holds it for `HOLD_MS` and
/// releases it.
async fn wait_in_queue() {
    let url: String = env("LOCK_URL");
    let backend = Backend::builder(url)
        .prefix("fair")
        .watchdog_lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let guard = Lock::new("q")
        .on(&backend)
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    worker::report("acquired", guard.fencing_token());
    tokio::time::sleep(Duration::from_millis(env("HOLD_MS"))).await;
    guard.release().await.unwrap();
}

/// The processes waiting for `fair:{q}`, as the server queues them.
fn queued(server: &RedisServer) -> i64 {
    server
        .command(&["ZCARD", "fair:{q}:queue"])
        .as_int()
        .unwrap()
}

/// Five processes queue one after another for a held lock; the second is killed and the third
/// paused (SIGSTOP) while queued. The lock moves past the dead one within its grant time, the
/// others take it in the order they came, and the paused one, woken, has lost its place: it
/// gets the lock last.
#[test]
fn a_killed_and_a_paused_waiter_lose_their_places_and_the_queue_keeps_its_order() {
    let server = RedisServer::start();
    queue_keeps_its_order("redis", &server.url(), &[&server]);
}

/// The same on Redlock, whose masters queue the waiters alike (by the ticket each waiter brings)
/// and tell them of releases: the first in line takes the lock by asking.
#[test]
fn a_killed_and_a_paused_waiter_lose_their_places_on_redlock_too() {
    let masters = RedisServer::start_many(3);
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let servers: Vec<&RedisServer> = masters.iter().collect();
    queue_keeps_its_order("redlock", &urls.join(","), &servers);
}

/// The queue test on the deployment at `url`, whose servers are `servers` (each queues every
/// waiter).
fn queue_keeps_its_order(name: &str, url: &str, servers: &[&RedisServer]) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = worker::runtime();
    let backend = Backend::builder(url).prefix("fair").build().unwrap();
    let guard = runtime
        .block_on(Lock::new("q").on(&backend).acquire())
        .unwrap();
    let mut waiters = Vec::new();
    for i in 0..5 {
        let worker = Worker::spawn(
            "worker_entry",
            "queue",
            &[
                ("LOCK_URL", url.to_owned()),
                ("HOLD_MS", HOLD.as_millis().to_string()),
            ],
        );
        waiters.push(worker);
        for server in servers {
            let lined_up = runtime.block_on(
                server.wait_until(Duration::from_secs(10), async || queued(server) == i + 1),
            );
            assert!(
                lined_up,
                "waiter {i} never queued: {} queued",
                queued(server)
            );
        }
    }
    waiters[1].signal(libc::SIGKILL);
    waiters[2].signal(libc::SIGSTOP);
    runtime.block_on(guard.release()).unwrap();

    // Who takes the lock, in which order, and when.
    let mut first = waiters.remove(0);
    let mut killed = waiters.remove(0);
    let mut paused = waiters.remove(0);
    let first_token: u64 = first
        .expect("acquired", Duration::from_secs(10))
        .parse()
        .unwrap();
    let first_released = Instant::now() + HOLD;
    assert!(first.wait().success());
    let fourth_token: u64 = waiters[0]
        .expect("acquired", Duration::from_secs(10))
        .parse()
        .unwrap();
    let moved_on = first_released.elapsed();
    // Woken while the fourth holds the lock and the fifth waits: it comes back behind the fifth.
    paused.signal(libc::SIGCONT);
    let fifth_token: u64 = waiters[1]
        .expect("acquired", Duration::from_secs(10))
        .parse()
        .unwrap();
    let paused_token: u64 = paused
        .expect("acquired", Duration::from_secs(10))
        .parse()
        .unwrap();
    for waiter in waiters.iter_mut().chain([&mut paused]) {
        assert!(waiter.wait().success());
    }
    assert!(!killed.wait().success());
    let leftovers: Vec<Reply> = servers
        .iter()
        .flat_map(|server| {
            let keys = server.command(&["KEYS", "fair:{q}:queue*"]);
            keys.as_array().unwrap().to_vec()
        })
        .collect();
    eprintln!(
        "FAIRNESS queue {name}: the lock moved past the killed waiter {moved_on:?} after the \
         first released it (grant time 300 ms); tokens in order {:?}; left on the servers: \
         {leftovers:?}",
        [first_token, fourth_token, fifth_token, paused_token]
    );
    assert!(
        first_token < fourth_token && fourth_token < fifth_token && fifth_token < paused_token,
        "the queue's order: the first, the fourth, the fifth, then the paused one"
    );
    // The killed waiter's place (or the lock handed to it) lapses within its grant time, 300 ms,
    // when the next waiter asks (it knows when the place lapses) — plus slack for a loaded
    // machine.
    assert!(
        moved_on < Duration::from_millis(300 + 300),
        "the lock stayed with the killed waiter for {moved_on:?}"
    );
    assert!(leftovers.is_empty(), "the queue is gone once nobody waits");
}

/// How long each waiter of the queue test holds the lock.
const HOLD: Duration = Duration::from_millis(150);

/// The in-process backend is one lock space per backend, and every waiter for its keys is a
/// task of this process: the key's local queue serves them in the order they asked. Groups of
/// tasks, standing in for processes, each get their share; tokens only grow, and no two
/// sections overlap.
#[test]
fn task_groups_share_a_key_fairly_in_process() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = worker::runtime();
    let mut failures = Vec::new();
    for cell in [Cell::new(3, 2, 1), Cell::new(4, 4, 0), Cell::new(6, 1, 2)] {
        let backend = Backend::in_process();
        let (tallies, out_of_order) = runtime.block_on(in_process_cell(&backend, cell));
        let sections: Vec<u64> = tallies.iter().map(|t| t.sections).collect();
        let mean = sections.iter().sum::<u64>() as f64 / cell.processes as f64;
        let shares: Vec<f64> = sections.iter().map(|s| *s as f64 / mean).collect();
        let worst_wait = tallies.iter().map(|t| t.worst_wait).max().unwrap();
        let overlaps: u64 = tallies.iter().map(|t| t.overlaps).sum();
        let busy: u64 = tallies.iter().map(|t| t.busy).sum();
        let shown: Vec<String> = shares.iter().map(|s| format!("{s:.2}")).collect();
        let line = format!(
            "FAIRNESS in-process {}x{} {:?} sections: {sections:?} shares [{}] worst wait \
             {worst_wait:?}; {busy} out of budget, {overlaps} overlaps, {out_of_order} tokens \
             out of order",
            cell.processes,
            cell.tasks,
            cell.section,
            shown.join(", ")
        );
        eprintln!("{line}");
        if shares.iter().any(|s| (s - 1.0).abs() > SHARE_BOUND)
            || busy + overlaps + out_of_order > 0
        {
            failures.push(line);
        }
    }
    assert!(
        failures.is_empty(),
        "unfair cells:\n{}",
        failures.join("\n")
    );
}

/// One in-process cell: a tally per group of tasks, and how many sections saw a token no larger
/// than the one before.
async fn in_process_cell(backend: &Backend, cell: Cell) -> (Vec<Tally>, u64) {
    use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
    use std::sync::Arc;
    let inside = Arc::new(AtomicI64::new(0));
    let last_token = Arc::new(AtomicU64::new(0));
    let out_of_order = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + cell.run;
    let mut groups = Vec::new();
    for _ in 0..cell.processes {
        let mut tasks = Vec::new();
        for _ in 0..cell.tasks {
            let (backend, inside) = (backend.clone(), inside.clone());
            let (last_token, out_of_order) = (last_token.clone(), out_of_order.clone());
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < deadline {
                    let asked = Instant::now();
                    let outcome = Lock::new("fair")
                        .on(&backend)
                        .wait(WAIT_BUDGET)
                        .run(async {
                            let waited = asked.elapsed();
                            let overlap = inside.fetch_add(1, Ordering::SeqCst) != 0;
                            let token = distlock::fencing_token().unwrap();
                            if last_token.fetch_max(token, Ordering::SeqCst) >= token {
                                out_of_order.fetch_add(1, Ordering::SeqCst);
                            }
                            if !cell.section.is_zero() {
                                tokio::time::sleep(cell.section).await;
                            }
                            inside.fetch_sub(1, Ordering::SeqCst);
                            (waited, overlap)
                        })
                        .await;
                    match outcome {
                        Ok((waited, overlap)) => {
                            tally.sections += 1;
                            tally.overlaps += u64::from(overlap);
                            tally.worst_wait = tally.worst_wait.max(waited);
                        }
                        Err(_) => tally.busy += 1,
                    }
                }
                tally
            }));
        }
        groups.push(tasks);
    }
    let mut tallies = Vec::new();
    for tasks in groups {
        let mut group = Tally::default();
        for task in tasks {
            group.add(task.await.unwrap());
        }
        tallies.push(group);
    }
    (tallies, out_of_order.load(Ordering::SeqCst))
}
