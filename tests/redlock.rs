//! Redlock over five real masters: exclusion and monotonic fencing tokens while masters are
//! paused and killed under several contending processes, split votes that do not stall, a
//! majority down, slow and paused masters, a lost reply from one master, and configuration.
//!
//! The conformance suite also runs on Redlock (three masters), in `conformance.rs`.

mod common;

use common::cell::{marker, read_cell};
use common::worker::{self, Worker};
use common::{forget_marker, watch_key_events};
use distlock::redis::{FencedStore, FencedWrite};
use distlock::{Backend, Lock, LockError, LostReason, Registry};
use distlock_test_support::{wait_until, FaultProxy, RedisServer, Reply, Wake, Xorshift};
use futures_util::StreamExt;
use redis::AsyncCommands;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PREFIX: &str = "rl";
const MASTER_TIMEOUT: Duration = Duration::from_millis(50);

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

fn lock_key(key: &str) -> String {
    format!("{PREFIX}:{{{key}}}")
}

/// A Redlock backend over `masters` with the tests' prefix and master timeout, its connections
/// opened and scripts loaded (so a fault armed next hits the command under test).
async fn warmed_redlock(
    masters: impl IntoIterator<Item = String>,
    configure: impl FnOnce(distlock::BackendBuilder) -> distlock::BackendBuilder,
) -> Backend {
    let backend = configure(
        Backend::redlock(masters)
            .prefix(PREFIX)
            .master_timeout(MASTER_TIMEOUT),
    )
    .build()
    .unwrap();
    Lock::new("warm-up")
        .on(&backend)
        .run(async {})
        .await
        .unwrap();
    backend
}

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    let masters: Vec<String> = std::env::var("MASTERS")
        .unwrap()
        .split(',')
        .map(str::to_owned)
        .collect();
    worker::runtime().block_on(async move {
        match role.as_str() {
            "chaos" => chaos_worker(masters).await,
            "split" => split_worker(masters).await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

const CHAOS_PROCESSES: usize = 3;
const CHAOS_TASKS: usize = 4;
/// Sections done before two masters are killed, and at least as many after.
const CHAOS_PHASE_SECTIONS: usize = 60;

/// Sections on one key, each checking it is alone, writing to a fenced resource and logging its
/// token in order, on a resource server of its own — until the test sets `stop` there (once its
/// chaos is done, however fast the sections are).
async fn chaos_worker(masters: Vec<String>) {
    let resource = std::env::var("RESOURCE_URL").unwrap();
    let backend = Backend::redlock(masters)
        .prefix(PREFIX)
        .watchdog_lease(Duration::from_secs(2))
        .master_timeout(MASTER_TIMEOUT)
        .build()
        .unwrap();
    let client = redis::Client::open(resource.as_str()).unwrap();
    let fenced = Arc::new(FencedStore::open(&resource).unwrap());
    worker::ready_then_go().await;
    let mut tasks = Vec::new();
    for _ in 0..CHAOS_TASKS {
        let backend = backend.clone();
        let fenced = fenced.clone();
        let mut redis = client.get_multiplexed_async_connection().await.unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut sections, mut overlaps, mut rejected, mut errors) =
                (0u64, 0u64, 0u64, Vec::new());
            loop {
                let stop: Option<String> = redis.get("stop").await.unwrap();
                if stop.is_some() {
                    break;
                }
                sections += 1;
                let section = Lock::new("chaos")
                    .on(&backend)
                    .wait(Duration::from_secs(60))
                    .run(async {
                        let inside: i64 = redis.incr("inside", 1).await.unwrap();
                        overlaps += (inside != 1) as u64;
                        let token = distlock::fencing_token().unwrap();
                        let written = fenced.write("resource", token, b"x").await.unwrap();
                        rejected += (written != FencedWrite::Applied) as u64;
                        let _: i64 = redis.rpush("tokens", token).await.unwrap();
                        let _: i64 = redis.decr("inside", 1).await.unwrap();
                    })
                    .await;
                if let Err(err) = section {
                    errors.push(err.to_string());
                }
            }
            (sections, overlaps, rejected, errors)
        }));
    }
    let (mut sections, mut overlaps, mut rejected, mut errors) = (0, 0, 0, Vec::new());
    for task in tasks {
        let (s, o, r, e) = task.await.unwrap();
        sections += s;
        overlaps += o;
        rejected += r;
        errors.extend(e);
    }
    worker::report(
        "done",
        format!(
            "{sections} {overlaps} {rejected} {} {}",
            errors.len(),
            errors.join(" | ")
        ),
    );
}

#[test]
fn processes_never_overlap_while_masters_are_paused_and_killed() {
    let masters = Arc::new(Mutex::new(RedisServer::start_many(5)));
    let resource = RedisServer::start();
    let master_urls = urls(&masters.lock().unwrap()).join(",");
    let mut workers: Vec<Worker> = (0..CHAOS_PROCESSES)
        .map(|_| {
            Worker::spawn(
                "worker_entry",
                "chaos",
                &[
                    ("MASTERS", master_urls.clone()),
                    ("RESOURCE_URL", resource.url()),
                ],
            )
        })
        .collect();
    let (mut rng, seed) = Xorshift::from_clock();
    let started = worker::start_together(&mut workers);
    // The chaos: one master at a time paused for 100 ms at random, every half second or so; two
    // killed once CHAOS_PHASE_SECTIONS sections are done (from then on every pause takes the
    // quorum away for its duration); the workers are stopped once as many more are done after
    // the kill and there were at least six pauses.
    let chaos = {
        let (masters, resource_addr) = (masters.clone(), resource.addr());
        std::thread::spawn(move || {
            let resource = |command: &[&str]| {
                distlock_test_support::command_at(resource_addr, command, Duration::from_secs(5))
                    .unwrap()
            };
            let mut alive: Vec<usize> = (0..5).collect();
            let mut killed = Vec::new();
            let mut killed_at = 0;
            let mut pauses = 0;
            loop {
                let progress = resource(&["LLEN", "tokens"]).as_int().unwrap() as usize;
                if killed.is_empty() && progress >= CHAOS_PHASE_SECTIONS {
                    for _ in 0..2 {
                        let victim = alive.remove(rng.below(alive.len()));
                        masters.lock().unwrap()[victim].kill();
                        killed.push(victim);
                    }
                    killed_at = progress;
                }
                if !killed.is_empty() && pauses >= 6 && progress >= killed_at + CHAOS_PHASE_SECTIONS
                {
                    resource(&["SET", "stop", "1"]);
                    break;
                }
                let paused = alive[rng.below(alive.len())];
                masters.lock().unwrap()[paused].pause();
                std::thread::sleep(Duration::from_millis(100));
                masters.lock().unwrap()[paused].resume();
                pauses += 1;
                std::thread::sleep(Duration::from_millis(300 + rng.below(200) as u64));
            }
            (pauses, killed)
        })
    };
    let (mut sections, mut overlaps, mut rejected, mut errors) = (0usize, 0u64, 0u64, Vec::new());
    for worker in &workers {
        let report = worker.expect("done", Duration::from_secs(240));
        let mut fields = report.splitn(5, ' ');
        sections += fields.next().unwrap().parse::<usize>().unwrap();
        overlaps += fields.next().unwrap().parse::<u64>().unwrap();
        rejected += fields.next().unwrap().parse::<u64>().unwrap();
        let failed: usize = fields.next().unwrap().parse().unwrap();
        if failed > 0 {
            errors.push(fields.next().unwrap_or_default().to_owned());
        }
    }
    let (pauses, killed) = chaos.join().unwrap();
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    let tokens: Vec<u64> = resource
        .command(&["LRANGE", "tokens", "0", "-1"])
        .as_array()
        .unwrap()
        .iter()
        .map(|token| token.as_str().unwrap().parse().unwrap())
        .collect();
    let regressions = tokens.windows(2).filter(|pair| pair[1] <= pair[0]).count();
    eprintln!(
        "REDLOCK chaos (seed {seed:#x}): {CHAOS_PROCESSES} processes x {CHAOS_TASKS} tasks, \
         {} of {sections} sections in {:?} with {pauses} master pauses and masters {killed:?} \
         killed: {overlaps} overlaps, {regressions} token regressions, {rejected} fenced writes \
         rejected, {} failed sections",
        tokens.len(),
        started.elapsed(),
        errors.len()
    );
    assert!(errors.is_empty(), "sections failed: {errors:?}");
    assert_eq!(tokens.len(), sections, "every section completed");
    assert_eq!(killed.len(), 2, "two masters were killed midway");
    assert!(pauses >= 6, "masters were paused: {pauses}");
    assert!(
        sections >= 2 * CHAOS_PHASE_SECTIONS,
        "sections ran before and after the kill: {sections}"
    );
    assert_eq!(overlaps, 0, "two holders were inside at once");
    assert_eq!(regressions, 0, "fencing tokens went back");
    assert_eq!(rejected, 0, "a holder's fenced write was rejected");
}

const SPLIT_TASKS: usize = 4;
const SPLIT_SECTIONS: usize = 20;

/// Contenders with a client each (no local queue between them), short sections, 5 s budgets.
async fn split_worker(masters: Vec<String>) {
    worker::ready_then_go().await;
    let mut tasks = Vec::new();
    for _ in 0..SPLIT_TASKS {
        let backend = Backend::redlock(masters.clone())
            .prefix(PREFIX)
            .master_timeout(MASTER_TIMEOUT)
            .build()
            .unwrap();
        tasks.push(tokio::spawn(async move {
            let (mut timeouts, mut errors) = (0u64, 0u64);
            for _ in 0..SPLIT_SECTIONS {
                match Lock::new("split")
                    .on(&backend)
                    .wait(Duration::from_secs(5))
                    .run(tokio::task::yield_now())
                    .await
                {
                    Ok(()) => {}
                    Err(err) if err.is_busy() => timeouts += 1,
                    Err(_) => errors += 1,
                }
            }
            (timeouts, errors, backend.stats().busy_replies)
        }));
    }
    let (mut timeouts, mut errors, mut busy) = (0, 0, 0);
    for task in tasks {
        let (t, e, b) = task.await.unwrap();
        timeouts += t;
        errors += e;
        busy += b;
    }
    worker::report("done", format!("{timeouts} {errors} {busy}"));
}

#[test]
fn contenders_that_split_the_votes_do_not_stall() {
    let masters = RedisServer::start_many(5);
    let mut workers: Vec<Worker> = (0..2)
        .map(|_| {
            Worker::spawn(
                "worker_entry",
                "split",
                &[("MASTERS", urls(&masters).join(","))],
            )
        })
        .collect();
    let started = worker::start_together(&mut workers);
    let (mut timeouts, mut errors, mut busy) = (0, 0, 0);
    for worker in &workers {
        let report = worker.expect("done", Duration::from_secs(120));
        let figures: Vec<u64> = report.split(' ').map(|n| n.parse().unwrap()).collect();
        timeouts += figures[0];
        errors += figures[1];
        busy += figures[2];
    }
    for worker in &mut workers {
        assert!(worker.wait().success());
    }
    let sections = 2 * SPLIT_TASKS * SPLIT_SECTIONS;
    eprintln!(
        "REDLOCK split votes: 8 contenders (a client each) in 2 processes, {sections} sections \
         in {:?}: {timeouts} timeouts, {errors} errors, {busy} busy replies",
        started.elapsed()
    );
    assert!(busy > 0, "the contenders never met: nothing was tested");
    assert_eq!((timeouts, errors), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_majority_down_every_call_ends_within_its_budget() {
    let mut masters = RedisServer::start_many(5);
    let backend = warmed_redlock(urls(&masters), |b| b).await;
    for server in &mut masters[..3] {
        server.kill();
    }
    // Scheduling on a loaded machine (CI runs this beside another lane); a call that waited on
    // a dead master's connection would take its 1 s connect timeout or more.
    let margin = Duration::from_millis(500);
    for budget in [Duration::ZERO, Duration::from_millis(300)] {
        let mut calls = Vec::new();
        for i in 0..8 {
            let backend = backend.clone();
            calls.push(tokio::spawn(async move {
                let started = Instant::now();
                let outcome = Lock::new(format!("down-{i}"))
                    .on(&backend)
                    .wait(budget)
                    .acquire()
                    .await;
                (started.elapsed(), outcome)
            }));
        }
        for call in calls {
            let (took, outcome) = tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .expect("a call hung")
                .unwrap();
            let err = outcome.expect_err("no quorum with 3 of 5 masters down");
            assert!(matches!(err, LockError::Backend(_)), "{err:?}");
            assert!(
                err.to_string().contains("no quorum for acquire"),
                "the error says why: {err}"
            );
            assert!(
                took <= budget + MASTER_TIMEOUT * 3 + margin,
                "with a {budget:?} budget the call took {took:?}"
            );
        }
    }
    assert_eq!(backend.stats().left_to_expire, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_slower_than_the_timeout_counts_as_a_refused_vote() {
    let masters = RedisServer::start_many(3);
    let slow = [
        FaultProxy::start(masters[0].addr()).await,
        FaultProxy::start(masters[1].addr()).await,
    ];
    let backend = warmed_redlock([slow[0].url(), slow[1].url(), masters[2].url()], |b| b).await;

    // One slow master of three: a quorum without it, at the cost of the timeout, not its delay.
    slow[0].set_delay(Duration::from_millis(100));
    let started = Instant::now();
    let guard = Lock::new("slow").on(&backend).acquire().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < MASTER_TIMEOUT + Duration::from_millis(100),
        "took {took:?}"
    );
    assert!(backend.inspect("slow").await.unwrap().is_some());
    guard.release().await.unwrap();

    // Two slow masters: no quorum; the call ends with the error within its budget.
    slow[1].set_delay(Duration::from_millis(100));
    let started = Instant::now();
    let err = Lock::new("slower")
        .on(&backend)
        .wait(Duration::from_millis(300))
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    assert!(
        took < Duration::from_millis(300) + MASTER_TIMEOUT * 3,
        "took {took:?}"
    );
    // The late votes land, and the releases sent after them remove them: nothing is left.
    for proxy in &slow {
        proxy.set_delay(Duration::ZERO);
    }
    let mut left = 0;
    let cleaned = wait_until(
        &masters.iter().collect::<Vec<_>>(),
        Wake::Commands,
        Duration::from_secs(5),
        async || {
            left = masters
                .iter()
                .filter(|server| read_cell(server, &lock_key("slower")).is_held())
                .count();
            left == 0
        },
    )
    .await;
    assert!(cleaned, "{left} copies of a failed acquire left");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_from_one_master_does_not_cost_its_vote() {
    let masters = RedisServer::start_many(3);
    let proxy = FaultProxy::start(masters[0].addr()).await;
    let ttl = Duration::from_millis(600);
    let backend = warmed_redlock([proxy.url(), masters[1].url(), masters[2].url()], |b| {
        b.watchdog_lease(ttl)
    })
    .await;
    // Every TTL change of the lock on the first master: the grant's `SET … PX`, then renewals.
    let mut expires = watch_key_events(&masters[0], &lock_key("lost"), "Kg").await;
    // The first master grants, and its answer is lost on the way back.
    proxy.drop_next_reply_matching(b"*2\r\n:1\r\n", true);
    let guard = Lock::new("lost").on(&backend).acquire().await.unwrap();
    assert_eq!(proxy.dropped().await, 1);
    let holder = backend.inspect("lost").await.unwrap().unwrap();
    let copy = read_cell(&masters[0], &lock_key("lost"));
    assert_eq!(copy.owner(), Some(holder.owner.as_str()), "the vote stands");
    // The grant, then a renewal there: the watchdog renews the copy whose reply was lost.
    let renewed = async {
        let mut expires = expires.on_message();
        for _ in 0..2 {
            expires.next().await.expect("the notification stream ended");
        }
    };
    tokio::time::timeout(ttl * 5, renewed)
        .await
        .expect("the copy on the first master was never renewed");
    assert!(guard.is_held());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_survives_one_paused_master_and_is_lost_in_time_without_a_quorum() {
    let masters = RedisServer::start_many(5);
    let ttl = Duration::from_millis(600);
    let backend = Backend::redlock(urls(&masters))
        .prefix(PREFIX)
        .watchdog_lease(ttl)
        .master_timeout(MASTER_TIMEOUT)
        // A wide drift margin, so "lost before the servers let go" is not a race.
        .clock_drift_factor(0.1)
        .build()
        .unwrap();

    let guard = Lock::new("one-paused")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    masters[0].pause();
    let before = backend.stats().renewed;
    tokio::time::sleep(ttl * 3).await;
    let renewed = backend.stats().renewed - before;
    masters[0].resume();
    assert!(guard.is_held(), "{:?}", guard.check());
    assert!(renewed >= 6, "renewed by the four others: {renewed}");
    guard.release().await.unwrap();

    let guard = Lock::new("three-paused")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    for server in &masters[..3] {
        server.pause();
    }
    let paused_at = Instant::now();
    let lost = tokio::time::timeout(ttl * 2, guard.lost())
        .await
        .expect("reported lost before two TTLs");
    let lost_after = paused_at.elapsed();
    for server in &masters[..3] {
        server.resume();
    }
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost:?}");
    // The last renewal a quorum confirmed was sent before the pause, so the quorum's copies
    // live at most one TTL past the pause; the holder must know it lost the lock before then.
    assert!(
        lost_after <= ttl,
        "reported lost {lost_after:?} after the pause, past the quorum's TTL of {ttl:?}"
    );
    eprintln!(
        "REDLOCK paused masters: one of five paused for 3 TTLs, {renewed} renewals, still held; \
         three paused: lost (Expired) {lost_after:?} after the pause, within the {ttl:?} TTL of \
         the quorum's copies"
    );
}

/// Tokens stay monotonic across quorums when the largest vote came from masters that are then
/// out of the next quorum, and when a minority loses its markers: only the write-back makes this
/// hold (the masters' clocks are one clock here, so masters far ahead are simulated by their
/// markers).
///
/// The guarantee covers a minority of faulty masters, and a master that answers after the
/// master timeout is one: this test makes two (one paused, one whose marker is lost), so its
/// timeout (150 ms) is long enough that no other master is slow even on a loaded machine. With the 50 ms
/// of the other tests, a loaded full run once saw a regression — a third master too slow to
/// count, as the guarantee allows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_stay_monotonic_across_different_quorums() {
    const GRANTS: u64 = 200;
    let masters = RedisServer::start_many(5);
    let backend = Backend::redlock(urls(&masters))
        .prefix(PREFIX)
        .master_timeout(Duration::from_millis(150))
        .build()
        .unwrap();
    let lock = lock_key("fenced");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let (mut rng, seed) = Xorshift::from_clock();
    let mut last = 0u64;
    let mut regressions = 0;
    for grant in 0..GRANTS {
        // Every 20 grants, the token markers of a quorum of masters jump an hour ahead (clocks
        // that were ahead), so the next token comes from them and the other two learn it only by
        // the write-back. The lock is free between grants: the key holds (at most) a marker.
        if grant % 20 == 0 {
            let ahead = marker(now_us + 3_600_000_000 + grant * 1_000_000);
            let first = rng.below(5);
            for master in [first, (first + 1) % 5, (first + 2) % 5] {
                assert_eq!(
                    masters[master].command(&["SET", &lock, &ahead]),
                    Reply::Simple("OK".into())
                );
            }
        }
        // Faults: one master paused, or one master's counter lost — never more than two at once.
        let paused = (rng.below(4) == 0).then(|| rng.below(5));
        if let Some(master) = paused {
            masters[master].pause();
        }
        if rng.below(4) == 0 {
            let lost = rng.below(5);
            if Some(lost) != paused {
                forget_marker(&masters[lost], &lock);
            }
        }
        let token = Lock::new("fenced")
            .on(&backend)
            .run(async { distlock::fencing_token().unwrap() })
            .await
            .unwrap();
        if let Some(master) = paused {
            masters[master].resume();
        }
        regressions += (token <= last) as usize;
        last = token;
    }
    eprintln!(
        "REDLOCK fencing (seed {seed:#x}): {GRANTS} grants over changing quorums with markers \
         jumping ahead and lost: {regressions} regressions"
    );
    assert_eq!(regressions, 0, "tokens went back across quorums");
    assert!(last > now_us + 3_600_000_000, "the jumps ahead were seen");
}

#[tokio::test]
async fn redlock_configuration_errors_name_the_problem() {
    let two = Backend::redlock(["redis://127.0.0.1:1", "redis://127.0.0.1:2"])
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        two.contains("lists 2 masters; Redlock needs at least 3"),
        "{two}"
    );
    let twice = Backend::redlock([
        "redis://127.0.0.1:7001",
        "redis://:secret@127.0.0.1:7001",
        "redis://127.0.0.1:7002",
    ])
    .build()
    .unwrap_err()
    .to_string();
    assert!(
        twice.contains("names the master 127.0.0.1:7001 twice"),
        "{twice}"
    );
    assert!(!twice.contains("secret"), "{twice}");
    let memory = Backend::builder("redis://127.0.0.1:1,memory://,redis://127.0.0.1:2")
        .build()
        .unwrap_err()
        .to_string();
    assert!(memory.contains("is not a Redis URL"), "{memory}");
    let single = Backend::builder("redis://127.0.0.1:1")
        .master_timeout(MASTER_TIMEOUT)
        .build()
        .unwrap_err()
        .to_string();
    assert!(single.contains("it applies to Redlock"), "{single}");
    let slow = Backend::redlock([
        "redis://127.0.0.1:1",
        "redis://127.0.0.1:2",
        "redis://127.0.0.1:3",
    ])
    .watchdog_lease(Duration::from_millis(300))
    .master_timeout(Duration::from_millis(100))
    .build()
    .unwrap_err()
    .to_string();
    assert!(
        slow.contains("less than a third of watchdog_lease"),
        "{slow}"
    );
}

/// The only test of this binary that uses the `"default"` backend, built from the environment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_comma_separated_distlock_url_means_redlock() {
    let masters = RedisServer::start_many(3);
    std::env::set_var(distlock::env::URL, urls(&masters).join(","));
    std::env::set_var(distlock::env::PREFIX, PREFIX);
    let token = Lock::new("from-env")
        .run(async { distlock::fencing_token() })
        .await
        .unwrap();
    assert!(token.is_some());
    let backend = Registry::global().get("default").unwrap();
    assert_eq!(backend.deployment(), distlock::Deployment::Redlock);
    let copies: i64 = masters
        .iter()
        .map(|server| {
            server
                .command(&["EXISTS", &lock_key("from-env")])
                .as_int()
                .unwrap()
        })
        .sum();
    assert_eq!(copies, 3, "every master voted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_names_the_master_of_each_finding() {
    let risky = RedisServer::start_with(
        distlock_test_support::ServerConfig::new().arg("maxmemory-policy", "allkeys-lru"),
    );
    let safe = RedisServer::start_with(
        distlock_test_support::ServerConfig::new().arg("appendonly", "yes"),
    );
    let mut gone = RedisServer::start();
    let backend = Backend::redlock([risky.url(), safe.url(), gone.url()])
        .prefix(PREFIX)
        .build()
        .unwrap();
    gone.kill();
    let findings = backend.doctor().await.unwrap();
    let checks: Vec<&str> = findings
        .iter()
        .map(|finding| finding.check.as_str())
        .collect();
    assert_eq!(
        checks,
        ["eviction", "persistence", "unreachable"],
        "{findings:?}"
    );
    assert!(
        findings[0]
            .advice
            .starts_with(&format!("master {}: maxmemory-policy", risky.addr())),
        "{}",
        findings[0]
    );
    assert!(
        findings[2].advice.contains(&gone.addr().to_string()),
        "{}",
        findings[2]
    );
}

/// Read locks and semaphores by quorum, under concurrency from two clients over 5 masters:
/// writers overlap nothing, readers share, and a semaphore of 3 (three exclusive slots) never
/// admits a fourth.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_read_locks_and_semaphores_hold_their_bounds() {
    use distlock::LockKind;
    use std::sync::atomic::{AtomicI64, Ordering};
    let masters = RedisServer::start_many(5);
    let clients = [
        warmed_redlock(urls(&masters), |b| b).await,
        warmed_redlock(urls(&masters), |b| b).await,
    ];
    let readers = Arc::new(AtomicI64::new(0));
    let writers = Arc::new(AtomicI64::new(0));
    let inside = Arc::new(AtomicI64::new(0));
    let (most_readers, most_inside, overlaps) = (
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicI64::new(0)),
        Arc::new(AtomicI64::new(0)),
    );
    let mut tasks = Vec::new();
    for task in 0..8 {
        let backend = clients[task % 2].clone();
        let (readers, writers, inside) = (readers.clone(), writers.clone(), inside.clone());
        let (most_readers, most_inside, overlaps) =
            (most_readers.clone(), most_inside.clone(), overlaps.clone());
        tasks.push(tokio::spawn(async move {
            for section in 0..12 {
                let writes = (section + task) % 4 == 0;
                let kind = if writes {
                    LockKind::Exclusive
                } else {
                    LockKind::Read
                };
                Lock::new("doc")
                    .kind(kind)
                    .on(&backend)
                    .wait(Duration::from_secs(30))
                    .run(async {
                        if writes {
                            let w = writers.fetch_add(1, Ordering::SeqCst) + 1;
                            let r = readers.load(Ordering::SeqCst);
                            if w != 1 || r != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            writers.fetch_sub(1, Ordering::SeqCst);
                        } else {
                            let r = readers.fetch_add(1, Ordering::SeqCst) + 1;
                            most_readers.fetch_max(r, Ordering::SeqCst);
                            if writers.load(Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            readers.fetch_sub(1, Ordering::SeqCst);
                        }
                    })
                    .await
                    .unwrap();
                Lock::new("api")
                    .kind(LockKind::Permits(3))
                    .on(&backend)
                    .wait(Duration::from_secs(30))
                    .run(async {
                        let n = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most_inside.fetch_max(n, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        inside.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let (overlaps, most_readers, most_inside) = (
        overlaps.load(Ordering::SeqCst),
        most_readers.load(Ordering::SeqCst),
        most_inside.load(Ordering::SeqCst),
    );
    eprintln!(
        "REDLOCK kinds: 8 tasks x 12 sections over 5 masters: {overlaps} overlaps, at most \
         {most_readers} readers at once, at most {most_inside} of 3 permits held at once"
    );
    assert_eq!(overlaps, 0);
    assert!(most_readers >= 2, "readers never shared: {most_readers}");
    assert!(most_inside <= 3, "a fourth permit holder: {most_inside}");
    assert!(
        most_inside >= 2,
        "the permits were never shared: {most_inside}"
    );
}

/// A writer's intent holds new readers back once a quorum of masters carries it, and `inspect`
/// reports the read lock waited on exactly then: an intent on one master of three is neither.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_intent_counts_once_a_quorum_of_masters_carries_it() {
    use distlock::LockKind;
    let masters = RedisServer::start_many(3);
    let backend = warmed_redlock(urls(&masters), |b| b).await;
    let read = || Lock::new("intent").kind(LockKind::Read).on(&backend);
    let first = read().acquire().await.unwrap();
    // The intent a waiting writer leaves ("S<fence> <until µs>"), written on some masters.
    let mark = |master: &RedisServer| {
        let key = lock_key("intent");
        let value = master.command(&["GET", &key]).as_str().unwrap();
        let fence = value.strip_prefix('R').expect("read-held").to_owned();
        let time = master.command(&["TIME"]);
        let time = time.as_array().unwrap();
        let now_us: u64 = time[0].as_str().unwrap().parse::<u64>().unwrap() * 1_000_000
            + time[1].as_str().unwrap().parse::<u64>().unwrap();
        let intent = format!("S{fence} {}", now_us + 30_000_000);
        master.command(&["SET", &key, &intent, "KEEPTTL"]);
    };
    mark(&masters[0]);
    let holder = backend.inspect("intent").await.unwrap().unwrap();
    assert!(
        !holder.waited_on,
        "an intent on one master of three: {holder:?}"
    );
    let second = read()
        .acquire()
        .await
        .expect("a reader needs a quorum free of the intent");
    mark(&masters[1]);
    let holder = backend.inspect("intent").await.unwrap().unwrap();
    assert!(holder.waited_on, "an intent on a quorum: {holder:?}");
    let late = read().acquire().await.unwrap_err();
    assert!(
        late.is_busy(),
        "the intent on a quorum holds readers back: {late:?}"
    );
    second.release().await.unwrap();
    first.release().await.unwrap();
}
