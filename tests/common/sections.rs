//! Fenced critical sections looped by worker processes on one key, while the parent breaks the
//! lock's servers: what the failover tests share. A separate Redis, the *resource*, outlives
//! every fault and records each section — how many were inside at once, its fencing token, and
//! whether the resource's fence ([`FencedStore`]) rejected its write.
//!
//! A worker reads its settings from the environment (`LOCK_URL`, `RESOURCE_URL`,
//! `WORKER_INDEX`, `LEASE_MS`, and `MIN_REPLICAS` for Sentinel), reports `ready`, runs its
//! sections from the parent's `go` until its `stop`, and reports `done` with its [`Tally`].
//! After the parent's `killed` (it killed a server), the first section that completes reports
//! `resumed`. Each section records its token (`tokens`) and when it ended (`ended_at_us`).

use super::worker;
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError};
use distlock_test_support::{RedisServer, Reply};
use redis::AsyncCommands;
use std::time::Duration;

/// Tasks per worker process, all on the key `counter`.
pub const TASKS: usize = 4;

/// What one worker counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub sections: u64,
    /// Sections that found another inside: two holders at once.
    pub overlaps: u64,
    /// Fenced writes the resource rejected: a holder whose token was older than one already
    /// written — the lock was granted to a newer holder before this one's section ended.
    pub rejected: u64,
    /// Calls that ended in an error (the wait budget spent on failures).
    pub errors: u64,
    /// Grants the engine gave back because too few replicas acknowledged them.
    pub unreplicated: u64,
    /// Sections completed after the parent's `killed`.
    pub after_kill: u64,
}

impl Tally {
    /// Sections the resource saw granted twice: overlapping, or fenced out by a newer token.
    pub fn double_grants(&self) -> u64 {
        self.overlaps + self.rejected
    }

    fn add(&mut self, other: Tally) {
        self.sections += other.sections;
        self.overlaps += other.overlaps;
        self.rejected += other.rejected;
        self.errors += other.errors;
        self.unreplicated += other.unreplicated;
        self.after_kill += other.after_kill;
    }

    fn line(&self) -> String {
        format!(
            "{} {} {} {} {} {}",
            self.sections,
            self.overlaps,
            self.rejected,
            self.errors,
            self.unreplicated,
            self.after_kill
        )
    }

    /// The tally a worker's `done` line carries.
    pub fn parse(line: &str) -> Tally {
        let n: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        Tally {
            sections: n[0],
            overlaps: n[1],
            rejected: n[2],
            errors: n[3],
            unreplicated: n[4],
            after_kill: n[5],
        }
    }

    /// The workers' tallies together, once each reported `done` and exited.
    pub fn collect(workers: &mut [worker::Worker]) -> Tally {
        let mut total = Tally::default();
        for worker in workers.iter_mut() {
            worker.send("stop");
        }
        for worker in workers.iter_mut() {
            total.add(Tally::parse(
                &worker.expect("done", Duration::from_secs(90)),
            ));
            assert!(worker.wait().success(), "a worker died");
        }
        total
    }
}

/// The environment a worker of `index` runs with.
pub fn worker_env(
    lock_url: &str,
    resource: &RedisServer,
    index: usize,
) -> Vec<(&'static str, String)> {
    vec![
        ("LOCK_URL", lock_url.to_owned()),
        ("RESOURCE_URL", resource.url()),
        ("WORKER_INDEX", index.to_string()),
    ]
}

/// The backend a worker locks with: `LOCK_URL`, a `LEASE_MS` watchdog lease (10 s by default),
/// `MIN_REPLICAS` replicas to acknowledge each grant (Sentinel), the CA of `TLS_CA_FILE` (TLS).
fn backend() -> Backend {
    let url = std::env::var("LOCK_URL").unwrap();
    let lease = std::env::var("LEASE_MS").map_or(10_000, |ms| ms.parse().unwrap());
    let mut builder = Backend::builder(url)
        .prefix(super::PREFIX)
        .watchdog_lease(Duration::from_millis(lease));
    if let Ok(ca) = std::env::var("TLS_CA_FILE") {
        builder = builder.tls_ca_file(ca);
    }
    if let Ok(replicas) = std::env::var("MIN_REPLICAS") {
        builder = builder
            .min_replicas(replicas.parse().unwrap())
            .replica_timeout(Duration::from_millis(200));
    }
    builder.build().unwrap()
}

/// A worker: fenced sections on `counter` from [`TASKS`] tasks until the parent says `stop`.
pub async fn run() {
    let backend = backend();
    let resource_url = std::env::var("RESOURCE_URL").unwrap();
    let fenced = std::sync::Arc::new(FencedStore::open(&resource_url).unwrap());
    let resource = redis::Client::open(resource_url.as_str()).unwrap();
    let me: usize = std::env::var("WORKER_INDEX").unwrap().parse().unwrap();
    Lock::new(format!("warm-up-{me}"))
        .on(&backend)
        .run(async {})
        .await
        .unwrap();
    worker::ready_then_go().await;
    let (orders_tx, orders) = tokio::sync::watch::channel(Order::Run);
    tokio::task::spawn_blocking(move || loop {
        // `killed`, then `stop` — or a closed stdin (the parent gone).
        let order = match worker::read_line().as_str() {
            "killed" => Order::Killed,
            _ => Order::Stop,
        };
        let _ = orders_tx.send(order);
        if order == Order::Stop {
            return;
        }
    });
    let resumed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let task = Task {
            backend: backend.clone(),
            fenced: fenced.clone(),
            redis: resource.get_multiplexed_async_connection().await.unwrap(),
            orders: orders.clone(),
            resumed: resumed.clone(),
            me,
        };
        tasks.push(tokio::spawn(task.sections()));
    }
    let mut total = Tally::default();
    for task in tasks {
        total.add(task.await.unwrap());
    }
    worker::report("done", total.line());
}

/// The parent's orders, in the order they come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Run,
    Killed,
    Stop,
}

/// One task of a worker.
struct Task {
    backend: Backend,
    fenced: std::sync::Arc<FencedStore>,
    redis: redis::aio::MultiplexedConnection,
    orders: tokio::sync::watch::Receiver<Order>,
    /// Set by the worker's first section after `killed`, which reports `resumed`.
    resumed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    me: usize,
}

impl Task {
    /// Sections until `stop`.
    async fn sections(mut self) -> Tally {
        let mut tally = Tally::default();
        loop {
            let order = *self.orders.borrow();
            if order == Order::Stop {
                return tally;
            }
            match self.section().await {
                Ok((overlap, rejected)) => {
                    tally.sections += 1;
                    tally.overlaps += u64::from(overlap);
                    tally.rejected += u64::from(rejected);
                    if order == Order::Killed {
                        tally.after_kill += 1;
                        if !self.resumed.swap(true, std::sync::atomic::Ordering::SeqCst) {
                            worker::report("resumed", self.me);
                        }
                    }
                }
                // Already waited `replica_timeout`: tried again at once.
                Err(LockError::ReplicasNotAcknowledged { .. }) => tally.unreplicated += 1,
                // The lock retried failures with backoff for its whole wait budget.
                Err(err) => {
                    tally.errors += 1;
                    eprintln!("worker {}: {err}", self.me);
                }
            }
        }
    }

    /// One fenced section on `counter`: whether another was inside, and whether the fence
    /// rejected its write.
    async fn section(&mut self) -> Result<(bool, bool), LockError> {
        let Task {
            backend,
            fenced,
            redis,
            ..
        } = self;
        Lock::new("counter")
            .on(backend)
            .wait(Duration::from_secs(30))
            .run(async {
                let inside: i64 = redis.incr("inside", 1).await.unwrap();
                let token = distlock::fencing_token().unwrap();
                let _: i64 = redis.rpush("tokens", token).await.unwrap();
                // Some work while holding the lock, so that a fault most likely lands while a
                // section holds it (and its release fails).
                tokio::time::sleep(Duration::from_millis(2)).await;
                let written = fenced
                    .write("fenced", token, token.to_string().as_bytes())
                    .await
                    .unwrap();
                let _: i64 = redis.decr("inside", 1).await.unwrap();
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_micros() as u64;
                let _: i64 = redis.rpush("ended_at_us", now).await.unwrap();
                (inside != 1, written != FencedWrite::Applied)
            })
            .await
    }
}

/// The tokens of every section so far, in the order they were recorded.
pub fn tokens(resource: &RedisServer) -> Vec<u64> {
    let Reply::Array(Some(items)) = resource.command(&["LRANGE", "tokens", "0", "-1"]) else {
        panic!("LRANGE failed")
    };
    items
        .iter()
        .map(|item| item.as_str().unwrap().parse().unwrap())
        .collect()
}

/// Consecutive sections whose token did not grow.
pub fn regressions(tokens: &[u64]) -> usize {
    tokens.windows(2).filter(|pair| pair[1] <= pair[0]).count()
}

/// Waits until the sections recorded `count` tokens, woken by the resource server's keyspace
/// notifications of the list.
pub fn wait_for_tokens(resource: &RedisServer, count: usize) {
    resource.command(&["CONFIG", "SET", "notify-keyspace-events", "Kl"]);
    let client = redis::Client::open(resource.url()).unwrap();
    let mut events = client.get_connection().unwrap();
    let mut pubsub = events.as_pubsub();
    pubsub.subscribe("__keyspace@0__:tokens").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    while tokens_len(resource) < count {
        pubsub
            .get_message()
            .expect("no section within 30 s: the workers stalled");
    }
}

/// How many sections recorded their token so far.
pub fn tokens_len(resource: &RedisServer) -> usize {
    match resource.command(&["LLEN", "tokens"]) {
        Reply::Int(n) => n as usize,
        other => panic!("LLEN: {other:?}"),
    }
}
