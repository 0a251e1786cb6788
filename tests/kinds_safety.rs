//! Read/write locks and semaphores across OS processes, against one real Redis: writers overlap
//! nothing, readers really share, writers do not starve behind a stream of readers, a semaphore
//! of 5 admits exactly 5, a killed permit holder's permit comes back with its TTL, and a paused
//! reader loses its lease to a writer and learns it at its next checkpoint.
//!
//! Each test starts worker processes (this binary again, see `common::worker`) and prints its
//! figures as `KINDS …` lines on stderr.

mod common;

use common::worker::{self, Worker};
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockKind};
use distlock_test_support::RedisServer;
use redis::AsyncCommands;
use std::time::{Duration, Instant};

const PROCESSES: usize = 3;
const RW_TASKS: usize = 4;
const RW_SECTIONS: usize = 40;
/// Every WRITE_EVERY-th section of a task writes; the others read.
const WRITE_EVERY: usize = 8;
const SEM_TASKS: usize = 8;
const SEM_SECTIONS: usize = 15;
const PERMITS: u32 = 5;

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    let url = std::env::var("REDIS_URL").unwrap();
    worker::runtime().block_on(async move {
        match role.as_str() {
            "read-write" => read_write(&url).await,
            "permits" => permits(&url).await,
            "hold-permit" => hold(&url, LockKind::Permits(PERMITS)).await,
            "hold-read" => hold(&url, LockKind::Read).await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

fn backend(url: &str, watchdog: Duration) -> Backend {
    Backend::builder(url)
        .prefix("kinds")
        .watchdog_lease(watchdog)
        .build()
        .unwrap()
}

/// Connects and loads the scripts, then starts with the other workers (so that every worker
/// contends from its first section).
async fn warm_up_then_go(backend: &Backend) {
    Lock::new(format!("warm-up-{}", std::process::id()))
        .on(backend)
        .run(async {})
        .await
        .unwrap();
    worker::ready_then_go().await;
}

/// Mixed readers and writers on one key. Writers check that nobody else is inside and write
/// the fenced resource; readers count how many read at once. Reports overlaps, the most
/// readers seen together, the longest a writer waited, and fenced writes rejected.
async fn read_write(url: &str) {
    let backend = backend(url, Duration::from_secs(2));
    let client = redis::Client::open(url).unwrap();
    let fenced = std::sync::Arc::new(FencedStore::open(url).unwrap());
    warm_up_then_go(&backend).await;
    let mut tasks = Vec::new();
    for task in 0..RW_TASKS {
        let backend = backend.clone();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        let fenced = fenced.clone();
        tasks.push(tokio::spawn(async move {
            let (mut overlaps, mut most_readers, mut longest_write_wait, mut rejected) =
                (0u64, 0i64, Duration::ZERO, 0u64);
            for section in 0..RW_SECTIONS {
                let writes = (section + task) % WRITE_EVERY == 0;
                let asked = Instant::now();
                let kind = if writes {
                    LockKind::Exclusive
                } else {
                    LockKind::Read
                };
                Lock::new("doc")
                    .kind(kind)
                    .on(&backend)
                    .wait(Duration::from_secs(60))
                    .run(async {
                        if writes {
                            longest_write_wait = longest_write_wait.max(asked.elapsed());
                            let writers: i64 = redis.incr("writers", 1).await.unwrap();
                            let readers: i64 = redis.get("readers").await.unwrap_or(0);
                            overlaps += (writers != 1 || readers != 0) as u64;
                            let token = distlock::fencing_token().unwrap();
                            let written =
                                fenced.write("resource", token, b"written").await.unwrap();
                            rejected += (written != FencedWrite::Applied) as u64;
                            tokio::time::sleep(Duration::from_millis(1)).await;
                            let _: i64 = redis.decr("writers", 1).await.unwrap();
                        } else {
                            let readers: i64 = redis.incr("readers", 1).await.unwrap();
                            most_readers = most_readers.max(readers);
                            let writers: i64 = redis.get("writers").await.unwrap_or(0);
                            overlaps += (writers != 0) as u64;
                            // Long reads, back to back from many tasks: without writer
                            // preference some reader is always inside and writers starve.
                            tokio::time::sleep(Duration::from_millis(15)).await;
                            let _: i64 = redis.decr("readers", 1).await.unwrap();
                        }
                    })
                    .await
                    .unwrap();
            }
            (overlaps, most_readers, longest_write_wait, rejected)
        }));
    }
    let (mut overlaps, mut most_readers, mut longest, mut rejected) = (0, 0, Duration::ZERO, 0);
    for task in tasks {
        let (o, m, l, r) = task.await.unwrap();
        overlaps += o;
        most_readers = most_readers.max(m);
        longest = longest.max(l);
        rejected += r;
    }
    worker::report(
        "done",
        format!(
            "{overlaps} {most_readers} {} {rejected}",
            longest.as_micros()
        ),
    );
}

/// Tasks taking permits of one semaphore; reports the most holders seen inside at once.
async fn permits(url: &str) {
    let backend = backend(url, Duration::from_secs(2));
    let client = redis::Client::open(url).unwrap();
    warm_up_then_go(&backend).await;
    let mut tasks = Vec::new();
    for _ in 0..SEM_TASKS {
        let backend = backend.clone();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let mut most = 0i64;
            for _ in 0..SEM_SECTIONS {
                Lock::new("api")
                    .kind(LockKind::Permits(PERMITS))
                    .on(&backend)
                    .wait(Duration::from_secs(60))
                    .run(async {
                        let inside: i64 = redis.incr("inside", 1).await.unwrap();
                        most = most.max(inside);
                        tokio::time::sleep(Duration::from_millis(3)).await;
                        let _: i64 = redis.decr("inside", 1).await.unwrap();
                    })
                    .await
                    .unwrap();
            }
            most
        }));
    }
    let mut most = 0;
    for task in tasks {
        most = most.max(task.await.unwrap());
    }
    worker::report("done", most);
}

/// Takes `kind` on "held" with a 600 ms watchdog lease, reports it, and on the parent's `go`
/// checks its lease.
async fn hold(url: &str, kind: LockKind) {
    let backend = backend(url, Duration::from_millis(600));
    Lock::new("held")
        .kind(kind)
        .on(&backend)
        .run(async {
            worker::report("acquired", distlock::fencing_token().unwrap());
            let order = tokio::task::spawn_blocking(worker::read_line)
                .await
                .unwrap();
            assert_eq!(order, "go");
            let check = match distlock::checkpoint() {
                Ok(()) => "held".to_owned(),
                Err(err) => format!("lost {:?}", err.lost_reason()),
            };
            worker::report("checkpoint", check);
        })
        .await
        .unwrap();
}

fn spawn_all(server: &RedisServer, role: &str) -> Vec<Worker> {
    (0..PROCESSES)
        .map(|_| Worker::spawn("worker_entry", role, &[("REDIS_URL", server.url())]))
        .collect()
}

#[test]
fn readers_share_writers_exclude_and_writers_do_not_starve() {
    let server = RedisServer::start();
    let mut workers = spawn_all(&server, "read-write");
    let started = worker::start_together(&mut workers);
    let (mut overlaps, mut most_readers, mut longest_us, mut rejected) = (0u64, 0i64, 0u128, 0u64);
    for worker in &workers {
        let done = worker.expect("done", Duration::from_secs(120));
        let figures: Vec<&str> = done.split(' ').collect();
        overlaps += figures[0].parse::<u64>().unwrap();
        most_readers = most_readers.max(figures[1].parse().unwrap());
        longest_us = longest_us.max(figures[2].parse().unwrap());
        rejected += figures[3].parse::<u64>().unwrap();
    }
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    let sections = PROCESSES * RW_TASKS * RW_SECTIONS;
    eprintln!(
        "KINDS read/write: {PROCESSES} processes x {RW_TASKS} tasks, {sections} sections (1 in \
         {WRITE_EVERY} writes) in {:?}: {overlaps} overlaps, at most {most_readers} readers at \
         once, longest writer wait {:?}, {rejected} fenced writes rejected",
        started.elapsed(),
        Duration::from_micros(longest_us as u64)
    );
    assert_eq!(overlaps, 0, "a writer overlapped a reader or a writer");
    assert_eq!(rejected, 0, "a current writer's fenced write was rejected");
    assert!(
        most_readers >= 2,
        "readers never read together: they were serialised ({most_readers})"
    );
    // A writer waits for the readers inside when it asked and the writers ahead of it; without
    // writer preference, a stream of overlapping readers keeps it out for seconds.
    assert!(
        longest_us < 500_000,
        "a writer waited {:?}: readers starved it",
        Duration::from_micros(longest_us as u64)
    );
}

#[test]
fn a_semaphore_of_five_never_admits_six() {
    let server = RedisServer::start();
    let mut workers = spawn_all(&server, "permits");
    let started = worker::start_together(&mut workers);
    let mut most = 0i64;
    for worker in &workers {
        most = most.max(
            worker
                .expect("done", Duration::from_secs(120))
                .parse()
                .unwrap(),
        );
    }
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    eprintln!(
        "KINDS semaphore: {PROCESSES} processes x {SEM_TASKS} tasks x {SEM_SECTIONS} sections on \
         {PERMITS} permits in {:?}: at most {most} holders at once",
        started.elapsed()
    );
    assert_eq!(most, i64::from(PERMITS), "exactly the permits, never more");
}

#[test]
fn a_killed_permit_holder_gives_its_permit_back_within_its_lease() {
    let server = RedisServer::start();
    let mut holder = Worker::spawn(
        "worker_entry",
        "hold-permit",
        &[("REDIS_URL", server.url())],
    );
    holder.expect("acquired", Duration::from_secs(30));
    let runtime = worker::runtime();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let others = runtime.block_on(async {
        let mut others = Vec::new();
        for _ in 1..PERMITS {
            let guard = Lock::new("held")
                .kind(LockKind::Permits(PERMITS))
                .on(&backend)
                .acquire()
                .await
                .unwrap();
            others.push(guard);
        }
        let full = Lock::new("held")
            .kind(LockKind::Permits(PERMITS))
            .on(&backend)
            .acquire()
            .await
            .unwrap_err();
        assert!(full.is_busy(), "{full:?}");
        others
    });
    holder.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    assert!(!holder.wait().success());
    let (taken_after, guard) = runtime.block_on(async {
        let guard = Lock::new("held")
            .kind(LockKind::Permits(PERMITS))
            .on(&backend)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        (killed_at.elapsed(), guard)
    });
    eprintln!(
        "KINDS killed permit holder: its permit (600ms lease) came back after {taken_after:?}"
    );
    // Renewed every 200 ms, the lease had at least 400 ms left when the holder died.
    assert!(
        taken_after >= Duration::from_millis(350),
        "the permit came back after {taken_after:?}, while the holder's lease was live"
    );
    assert!(
        taken_after <= Duration::from_millis(600 + 300),
        "the permit came back only after {taken_after:?}"
    );
    runtime.block_on(async {
        guard.release().await.unwrap();
        for other in others {
            other.release().await.unwrap();
        }
    });
}

#[test]
fn a_paused_reader_loses_to_a_writer_and_learns_it_at_its_checkpoint() {
    let server = RedisServer::start();
    let mut reader = Worker::spawn("worker_entry", "hold-read", &[("REDIS_URL", server.url())]);
    let reader_token: u64 = reader
        .expect("acquired", Duration::from_secs(30))
        .parse()
        .unwrap();
    reader.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();
    let runtime = worker::runtime();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let (guard, taken_after) = runtime.block_on(async {
        let guard = Lock::new("held")
            .on(&backend)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        (guard, stopped_at.elapsed())
    });
    assert!(guard.fencing_token() > reader_token);
    reader.signal(libc::SIGCONT);
    reader.send("go");
    let checkpoint = reader.expect("checkpoint", Duration::from_secs(30));
    assert!(reader.wait().success());
    runtime.block_on(guard.release()).unwrap();
    eprintln!(
        "KINDS paused reader: a writer got in {taken_after:?} after the reader stopped (600ms \
         lease); on SIGCONT its checkpoint said `{checkpoint}`"
    );
    assert!(
        taken_after >= Duration::from_millis(350),
        "the writer got in after {taken_after:?}, while the reader's lease was live"
    );
    assert!(
        taken_after <= Duration::from_millis(600 + 300),
        "the writer waited {taken_after:?}"
    );
    assert_eq!(checkpoint, "lost Some(Expired)");
}
