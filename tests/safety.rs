//! Safety across OS processes, against one real Redis: the numbers that matter are 0 overlaps,
//! 0 lost updates and every stale write rejected.
//!
//! Each test starts worker processes (this binary again, see `common::worker`) and prints its
//! figures as `SAFETY …` lines on stderr.

mod common;

use common::worker::{self, Worker};
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock};
use distlock_test_support::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};

const TASKS: usize = 4;
const SECTIONS_PER_TASK: usize = 40;

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    let url = std::env::var("REDIS_URL").unwrap();
    let runtime = worker::runtime();
    runtime.block_on(async move {
        match role.as_str() {
            "contend" => contend(&url).await,
            "hold" => hold(&url).await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

fn backend(url: &str, watchdog: Duration) -> Backend {
    Backend::builder(url)
        .prefix("safety")
        .watchdog_lease(watchdog)
        .build()
        .unwrap()
}

/// Read-modify-write of a counter without atomic commands, under the lock, from several tasks;
/// each section appends this worker's index to a list, so the parent sees the interleaving.
/// `LOCAL_BATCH_MS`: the backend's `local_batch`.
async fn contend(url: &str) {
    let local_batch = std::env::var("LOCAL_BATCH_MS").unwrap().parse().unwrap();
    let backend = Backend::builder(url)
        .prefix("safety")
        .watchdog_lease(Duration::from_secs(2))
        .local_batch(Duration::from_millis(local_batch))
        .build()
        .unwrap();
    let client = redis::Client::open(url).unwrap();
    let fenced = std::sync::Arc::new(FencedStore::open(url).unwrap());
    let me: u32 = std::env::var("WORKER_INDEX").unwrap().parse().unwrap();
    // Connect and load the scripts before the start line, so every worker starts at once.
    Lock::new(format!("warm-up-{me}"))
        .on(&backend)
        .run(async {})
        .await
        .unwrap();
    worker::ready_then_go().await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let backend = backend.clone();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        let fenced = fenced.clone();
        tasks.push(tokio::spawn(async move {
            let (mut overlaps, mut rejected) = (0u64, 0u64);
            for _ in 0..SECTIONS_PER_TASK {
                Lock::new("counter")
                    .on(&backend)
                    .wait(Duration::from_secs(60))
                    .run(async {
                        let inside: i64 = redis.incr("inside", 1).await.unwrap();
                        overlaps += (inside != 1) as u64;
                        let value: i64 = redis.get("value").await.unwrap_or(0);
                        // Widen the window between read and write.
                        tokio::task::yield_now().await;
                        let _: () = redis.set("value", value + 1).await.unwrap();
                        let _: i64 = redis.rpush("order", me).await.unwrap();
                        let token = distlock::fencing_token().unwrap();
                        let written = fenced
                            .write("fenced-value", token, (value + 1).to_string().as_bytes())
                            .await
                            .unwrap();
                        rejected += (written != FencedWrite::Applied) as u64;
                        let _: i64 = redis.decr("inside", 1).await.unwrap();
                    })
                    .await
                    .unwrap();
            }
            (overlaps, rejected)
        }));
    }
    let (mut overlaps, mut rejected) = (0, 0);
    for task in tasks {
        let (o, r) = task.await.unwrap();
        overlaps += o;
        rejected += r;
    }
    worker::report(
        "done",
        format!("{overlaps} {rejected} {}", backend.stats().busy_replies),
    );
}

/// Takes the lock, reports its token, and waits for the parent; then checks and writes.
async fn hold(url: &str) {
    let backend = backend(url, Duration::from_millis(500));
    let fenced = FencedStore::open(url).unwrap();
    worker::hold_then_write_late(&backend, &fenced).await;
}

/// Takes the worker's lock: succeeds once the stopped or killed holder's lease runs out.
async fn take_over(backend: &Backend) -> distlock::LockGuard {
    Lock::new("held")
        .on(backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap()
}

/// Three processes: a release usually finds more than one other process waiting, and hands
/// the lock over (or announces it) at once.
#[test]
fn processes_contending_on_one_key_never_overlap_or_lose_updates() {
    // At least one switch in four sections.
    processes_contending(3, 1, 3 * TASKS * SECTIONS_PER_TASK / 4);
}

/// Two processes: a release finds the other process's next waiter alone, and transfers the lock
/// to its own process's next task ahead of it for up to `local_batch` — 5 ms here, several
/// sections. Batches hold fewer switches (80 of 320 sections here; how many depends on the
/// machine's speed), but the processes must still take turns: a process that kept the lock for
/// its queued tasks would make one switch in all.
#[test]
fn two_processes_taking_turns_in_local_batches_never_overlap_or_lose_updates() {
    processes_contending(2, 5, 8);
}

/// `processes` workers contend, each backend with a `local_batch` of `local_batch_ms`; at least
/// `min_switches` switches between processes show that they took turns.
fn processes_contending(processes: usize, local_batch_ms: u64, min_switches: usize) {
    let server = RedisServer::start();
    let mut workers: Vec<Worker> = (0..processes)
        .map(|i| {
            Worker::spawn(
                "worker_entry",
                "contend",
                &[
                    ("REDIS_URL", server.url()),
                    ("WORKER_INDEX", i.to_string()),
                    ("LOCAL_BATCH_MS", local_batch_ms.to_string()),
                ],
            )
        })
        .collect();
    let started = worker::start_together(&mut workers);
    let (mut overlaps, mut rejected) = (0u64, 0u64);
    let mut busy_replies = Vec::new();
    for worker in &workers {
        let done = worker.expect("done", Duration::from_secs(120));
        let mut figures = done.split(' ').map(|n| n.parse::<u64>().unwrap());
        overlaps += figures.next().unwrap();
        rejected += figures.next().unwrap();
        busy_replies.push(figures.next().unwrap());
    }
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    let sections = (processes * TASKS * SECTIONS_PER_TASK) as i64;
    let value: i64 = server
        .command(&["GET", "value"])
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let lost_updates = sections - value;
    let order: Vec<String> = server
        .command(&["LRANGE", "order", "0", "-1"])
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry.as_str().unwrap())
        .collect();
    let switches = order.windows(2).filter(|pair| pair[0] != pair[1]).count();
    eprintln!(
        "SAFETY contention: {processes} processes x {TASKS} tasks, {sections} sections in {:?}: \
         {overlaps} overlaps, {lost_updates} lost updates, {rejected} fenced writes rejected; \
         {switches} switches between processes; busy replies per process {busy_replies:?}",
        started.elapsed()
    );
    // The figures below prove nothing unless the processes really contended.
    assert_eq!(
        order.len() as i64,
        sections,
        "every section recorded its process"
    );
    assert!(
        switches >= min_switches,
        "the processes barely interleaved ({switches} switches in {sections} sections)"
    );
    for (process, busy) in busy_replies.iter().enumerate() {
        assert!(*busy > 0, "process {process} never found the lock busy");
    }
    assert_eq!(overlaps, 0, "two holders were inside at once");
    assert_eq!(lost_updates, 0, "read-modify-write lost updates");
    assert_eq!(rejected, 0, "a current holder's fenced write was rejected");
}

/// The holder's lock on the server, as the parent sees it just before stopping or killing the
/// holder: its fencing token, and when it will expire unless renewed.
struct Observed {
    token: u64,
    expires_at: Instant,
}

fn observe_held(server: &RedisServer) -> Observed {
    let read_at = Instant::now();
    let replies = server.pipeline(&[&["GET", "safety:{held}"], &["PTTL", "safety:{held}"]]);
    let cell = common::cell::parse(&replies[0].as_str().expect("the holder's lock exists"));
    assert!(cell.is_held(), "the holder's lock is held: {cell:?}");
    let token = cell.token().unwrap();
    let pttl = replies[1].as_int().unwrap();
    assert!(pttl > 0, "the holder's lock has a TTL: {pttl}");
    let lease = Duration::from_millis(500);
    assert!(
        Duration::from_millis(pttl as u64) >= lease * 2 / 3 - distlock_drift(lease),
        "the holder's watchdog keeps the lease renewed: PTTL {pttl} ms"
    );
    Observed {
        token,
        expires_at: read_at + Duration::from_millis(pttl as u64),
    }
}

/// The margin distlock takes off every lease: 1% plus 2 ms.
fn distlock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// A takeover may come only once the holder's lease has run out on the server (the PTTL read
/// just before the holder stopped, less a millisecond of rounding), and soon after.
fn assert_takeover_timing(observed: &Observed, stopped_at: Instant, taken_at: Instant) {
    let rounding = Duration::from_millis(1);
    assert!(
        taken_at + rounding >= observed.expires_at,
        "taken over {:?} before the holder's lease ran out: the lock did not exclude",
        observed.expires_at - taken_at
    );
    let lease = Duration::from_millis(500);
    assert!(
        taken_at - stopped_at <= lease + Duration::from_millis(300),
        "taken over only after {:?}",
        taken_at - stopped_at
    );
}

#[test]
fn a_paused_holder_wakes_up_lost_and_its_late_write_is_rejected() {
    let server = RedisServer::start();
    let mut holder = Worker::spawn("worker_entry", "hold", &[("REDIS_URL", server.url())]);
    let stale_token: u64 = holder
        .expect("acquired", Duration::from_secs(30))
        .parse()
        .unwrap();
    let observed = observe_held(&server);
    assert_eq!(observed.token, stale_token, "the worker holds the lock");
    holder.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();

    let runtime = worker::runtime();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let (guard, taken_at) = runtime.block_on(worker::take_over_and_write(&backend, &server.url()));
    let fresh_token = guard.fencing_token();
    assert!(fresh_token > stale_token);

    holder.signal(libc::SIGCONT);
    holder.send("go");
    let checkpoint = holder.expect("checkpoint", Duration::from_secs(30));
    let write = holder.expect("write", Duration::from_secs(30));
    assert!(holder.wait().success());
    runtime.block_on(guard.release()).unwrap();
    eprintln!(
        "SAFETY pause: holder stopped with {:?} left on its 500ms lease; lock taken over after \
         {:?}; on SIGCONT its checkpoint said `{checkpoint}`; its late write: {write}",
        observed.expires_at.saturating_duration_since(stopped_at),
        taken_at - stopped_at
    );
    assert_takeover_timing(&observed, stopped_at, taken_at);
    assert_eq!(
        checkpoint, "lost Some(Expired)",
        "the paused holder learns from its own clock that the lease ran out"
    );
    assert_eq!(
        write,
        format!(
            "{:?}",
            FencedWrite::Rejected {
                highest: fresh_token
            }
        )
    );
}

#[test]
fn a_killed_holder_is_taken_over_within_its_lease() {
    let server = RedisServer::start();
    let mut holder = Worker::spawn("worker_entry", "hold", &[("REDIS_URL", server.url())]);
    let token: u64 = holder
        .expect("acquired", Duration::from_secs(30))
        .parse()
        .unwrap();
    let observed = observe_held(&server);
    assert_eq!(observed.token, token, "the worker holds the lock");
    holder.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    assert!(!holder.wait().success());
    let (taken_at, next_token) = worker::runtime().block_on(async {
        let backend = backend(&server.url(), Duration::from_secs(5));
        let guard = take_over(&backend).await;
        let taken_at = Instant::now();
        let next_token = guard.fencing_token();
        guard.release().await.unwrap();
        (taken_at, next_token)
    });
    eprintln!(
        "SAFETY kill: holder with a 500ms watchdog lease SIGKILLed with {:?} left on it; taken \
         over after {:?}",
        observed.expires_at.saturating_duration_since(killed_at),
        taken_at - killed_at
    );
    assert_takeover_timing(&observed, killed_at, taken_at);
    assert!(next_token > token, "the next holder's token is larger");
}
