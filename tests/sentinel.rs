//! Replicated deployments, on real processes started per test: a primary with replicas, three
//! sentinels, and a separate resource server that records every critical section (it survives
//! the failovers, so it sees any overlap across them).
//!
//! Figures are printed as `SENTINEL …` lines on stderr.

mod common;

use common::cell::{read_cell, Cell};
use common::sections::{self, tokens, tokens_len, wait_for_tokens, Tally};
use common::worker::{self, Worker};
use common::PREFIX;
use distlock::{Backend, Lock, LockError, LostReason};
use distlock_test_support::{RedisServer, Reply, SentinelGroup, ServerConfig};
use futures_util::StreamExt;
use std::time::{Duration, Instant};

/// How long a primary may be silent before a sentinel thinks it down.
const DOWN_AFTER: Duration = Duration::from_millis(500);
const PROCESSES: usize = 3;
const TASKS: usize = 4;
const REPLICA_TIMEOUT: Duration = Duration::from_millis(200);
/// The workers' lease TTL: far longer than a failover, so that sections resuming soon after the
/// switch shows that the releases that failed during it were finished on the new primary, not
/// left to expire.
const SECTION_LEASE: Duration = Duration::from_secs(10);

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    let runtime = worker::runtime();
    runtime.block_on(async move {
        match role.as_str() {
            "sections" => sections::run().await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

fn sentinel_backend(url: &str, watchdog: Duration) -> Backend {
    Backend::builder(url)
        .prefix(PREFIX)
        .watchdog_lease(watchdog)
        .min_replicas(1)
        .replica_timeout(REPLICA_TIMEOUT)
        .build()
        .unwrap()
}

/// Failover under load: 3 processes × 4 tasks loop fenced sections through the sentinels; the
/// primary is SIGKILLed. Sections resume on the promoted replica, with 0 overlaps and 0 token
/// regressions, and no worker dies. (Two replicas: with `min_replicas = 1`, the promoted one
/// still has a replica to acknowledge grants.)
#[test]
fn failover_under_load_resumes_without_overlap_or_token_regression() {
    failover_under_load(SentinelGroup::start_with_replicas(2, DOWN_AFTER));
}

/// The same over TLS only (`rediss-sentinel://`): the workers follow the switch to the promoted
/// replica's TLS port, as the sentinels name it.
#[test]
fn failover_under_load_over_tls_resumes_without_overlap_or_token_regression() {
    failover_under_load(SentinelGroup::start_tls(2, DOWN_AFTER));
}

fn failover_under_load(mut group: SentinelGroup) {
    let resource = RedisServer::start();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|index| {
            let mut env = sections::worker_env(&group.sentinel_url(), &resource, index);
            env.push(("MIN_REPLICAS", "1".to_owned()));
            env.push(("LEASE_MS", SECTION_LEASE.as_millis().to_string()));
            if let Some(pki) = group.pki() {
                env.push(("TLS_CA_FILE", pki.ca().to_string_lossy().into_owned()));
            }
            Worker::spawn("worker_entry", "sections", &env)
        })
        .collect();
    worker::start_together(&mut workers);
    // Load before the kill: wait until the sections ran a while.
    wait_for_tokens(&resource, 200);
    let before = tokens(&resource).len();
    let killed_at = Instant::now();
    let switched = group.kill_primary_and_wait_failover();
    for worker in &mut workers {
        worker.send("killed");
    }
    let mut resumed = Vec::new();
    for worker in &workers {
        worker.expect("resumed", Duration::from_secs(30));
        resumed.push(killed_at.elapsed());
    }
    // Sections on the new primary for a while, then stop.
    wait_for_tokens(&resource, tokens_len(&resource) + 200);
    let total = Tally::collect(&mut workers);
    let tokens = tokens(&resource);
    // The failover as callers saw it: the longest pause between two sections.
    let Reply::Array(Some(ends)) = resource.command(&["LRANGE", "ended_at_us", "0", "-1"]) else {
        panic!("LRANGE failed")
    };
    let mut ends: Vec<u64> = ends
        .iter()
        .map(|end| end.as_str().unwrap().parse().unwrap())
        .collect();
    ends.sort_unstable();
    let longest_pause = ends
        .windows(2)
        .map(|pair| Duration::from_micros(pair[1] - pair[0]))
        .max()
        .unwrap();
    let regressions = tokens.windows(2).filter(|pair| pair[1] <= pair[0]).count();
    let noscripts = error_count(group.primary(), "NOSCRIPT");
    let last_resume = resumed.iter().max().unwrap();
    eprintln!(
        "SENTINEL failover under load ({}): {PROCESSES} processes x {TASKS} tasks, {} sections ({before} \
         before the kill, {} after); sentinels switched {switched:?} after the kill, every worker \
         resumed within {last_resume:?} (down-after {DOWN_AFTER:?}); the longest pause between \
         two sections {longest_pause:?}; {} overlaps, {regressions} \
         token regressions, {} fenced writes rejected; {} errors and {} unacknowledged grants \
         while the primary was gone; {noscripts} NOSCRIPT replies on the new primary",
        group.sentinel_url().split("://").next().unwrap(),
        total.sections, total.after_kill, total.overlaps, total.rejected, total.errors,
        total.unreplicated
    );
    assert_eq!(total.overlaps, 0, "critical sections overlapped");
    assert_eq!(regressions, 0, "fencing tokens went back: {tokens:?}");
    assert_eq!(total.rejected, 0, "a fenced write was rejected");
    assert_eq!(
        tokens.len() as u64,
        total.sections,
        "every section recorded its token"
    );
    assert!(
        total.after_kill >= 200,
        "sections resumed after the failover"
    );
    // The new primary's empty script cache costs the calls in flight when they first reach it
    // (at most every task's acquire, release and renewal), never every call after.
    assert!(
        noscripts <= (PROCESSES * TASKS * 3) as u64,
        "{noscripts} NOSCRIPT replies: scripts are not cached after the first"
    );
    // Sections resume once the sentinels switched: the release that failed while the primary
    // was gone (the kill most likely hit a section) is finished on the new one, not left to
    // its 10 s TTL.
    assert!(
        longest_pause < switched + SECTION_LEASE / 4,
        "sections paused for {longest_pause:?}; the switch took {switched:?} after the kill"
    );
}

/// A primary and its replica, in sync. `WAIT` times out on the server's clock ticks: at hz 100,
/// within 10 ms of its timeout (at the default hz 10, up to 100 ms late).
fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start_with(ServerConfig::new().arg("hz", "100"));
    let replica = RedisServer::start_with(ServerConfig::new().replica_of(primary.port()));
    replica.wait_for_replica_sync();
    primary.wait_for_replicas(1);
    (primary, replica)
}

/// A backend on `primary` whose grants wait up to `REPLICA_TIMEOUT` for one replica; its locks
/// efficiency locks unless `fenced`.
fn acknowledged_backend(primary: &RedisServer, fenced: bool) -> Backend {
    Backend::builder(primary.url())
        .prefix(PREFIX)
        .min_replicas(1)
        .replica_timeout(REPLICA_TIMEOUT)
        .fencing_tokens(fenced)
        .build()
        .unwrap()
}

/// A replica that does not answer (SIGSTOP): an acquire with `min_replicas = 1` fails after
/// `replica_timeout` with the dedicated error, and leaves no lock behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_grant_fails_with_its_own_error_and_leaves_no_lock() {
    let (primary, replica) = primary_and_replica();
    let backend = acknowledged_backend(&primary, true);
    // Acknowledged: the lock is granted, its token on the replica too.
    let guard = Lock::new("acked").on(&backend).acquire().await.unwrap();
    let lock = common::SingleRedis::lock_key("acked");
    assert_eq!(
        read_cell(&replica, &lock).token(),
        Some(guard.fencing_token()),
        "WAIT returned once the replica had the grant"
    );
    guard.release().await.unwrap();
    // The doctor sees that one replica is all there is: a failover would leave none.
    let findings = backend.doctor().await.unwrap();
    assert!(
        findings
            .iter()
            .any(|finding| finding.check == distlock::Check::Replicas
                && finding.advice.contains("exactly 1 replica(s) are online")),
        "{findings:?}"
    );

    replica.pause();
    let started = Instant::now();
    let err = Lock::new("unacked")
        .on(&backend)
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    let lock = common::SingleRedis::lock_key("unacked");
    let left_behind = read_cell(&primary, &lock).is_held();
    replica.resume();
    eprintln!("SENTINEL replica paused: the acquire failed after {took:?}: {err}");
    match err {
        LockError::ReplicasNotAcknowledged {
            ref key,
            acknowledged,
            wanted,
            timeout,
        } => {
            assert_eq!(key, "unacked");
            assert_eq!((acknowledged, wanted, timeout), (0, 1, REPLICA_TIMEOUT));
        }
        other => panic!("expected ReplicasNotAcknowledged, got {other:?}"),
    }
    assert!(
        err.to_string()
            .contains("0 of 1 replicas acknowledged it within 200ms"),
        "{err}"
    );
    assert!(
        took >= REPLICA_TIMEOUT,
        "the WAIT was not waited for: {took:?}"
    );
    // The WAIT's timeout, a server tick, the release of the grant: not a response timeout.
    assert!(
        took < REPLICA_TIMEOUT + Duration::from_millis(100),
        "the failure came {took:?} after the call, for a {REPLICA_TIMEOUT:?} replica timeout"
    );
    assert!(!left_behind, "the unacknowledged grant was left held");
    // Free at once for anyone: no wait budget needed.
    let again = Lock::new("unacked").on(&backend).acquire().await.unwrap();
    again.release().await.unwrap();

    // A replica timeout longer than the response timeout (500 ms; Redisson waits 1 s for its
    // replicas): the grant's reply, which carries the WAIT, is waited for, not taken for lost.
    let patient_wait = Duration::from_millis(700);
    let patient = Backend::builder(primary.url())
        .prefix(PREFIX)
        .min_replicas(1)
        .replica_timeout(patient_wait)
        .build()
        .unwrap();
    replica.pause();
    let started = Instant::now();
    let err = Lock::new("patient")
        .on(&patient)
        .acquire()
        .await
        .unwrap_err();
    let took = started.elapsed();
    replica.resume();
    assert!(
        matches!(
            err,
            LockError::ReplicasNotAcknowledged {
                acknowledged: 0,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(
        took >= patient_wait && took < patient_wait + Duration::from_millis(150),
        "failed after {took:?} for a {patient_wait:?} replica timeout"
    );
}

/// An efficiency lock's first try, `SET NX PX`, is followed by `WAIT` in the same round trip
/// like a scripted grant: acknowledged, the replica holds the claim; unacknowledged, the claim
/// is taken back and the caller told so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_efficiency_locks_claim_waits_for_its_replica_or_is_taken_back() {
    let (primary, replica) = primary_and_replica();
    let backend = acknowledged_backend(&primary, false);
    let scripts_before = common::command_calls(&primary, "evalsha");
    let guard = Lock::new("claimed").on(&backend).acquire().await.unwrap();
    assert_eq!(
        common::command_calls(&primary, "evalsha"),
        scripts_before,
        "the grant was a SET NX, not a script"
    );
    let lock = common::SingleRedis::lock_key("claimed");
    assert_eq!(guard.fencing_token(), 0);
    assert_eq!(
        read_cell(&replica, &lock).token(),
        Some(0),
        "WAIT returned once the replica had the claim"
    );
    guard.release().await.unwrap();
    assert_eq!(
        read_cell(&primary, &lock),
        Cell::Absent,
        "released by deleting"
    );

    replica.pause();
    let err = Lock::new("unacked")
        .on(&backend)
        .acquire()
        .await
        .unwrap_err();
    let left_behind = read_cell(&primary, &common::SingleRedis::lock_key("unacked")).is_held();
    replica.resume();
    assert!(
        matches!(
            err,
            LockError::ReplicasNotAcknowledged {
                acknowledged: 0,
                wanted: 1,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(!left_behind, "the unacknowledged claim was left held");
}

/// Renewals the replicas do not acknowledge do not advance the lease: with the replica paused,
/// a watchdog lease runs out on its local clock and is reported lost, although the primary
/// applied every renewal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unacknowledged_renewals_do_not_extend_the_lease() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_with(ServerConfig::new().replica_of(primary.port()));
    replica.wait_for_replica_sync();
    primary.wait_for_replicas(1);
    let ttl = Duration::from_millis(900);
    let backend = Backend::builder(primary.url())
        .prefix(PREFIX)
        .watchdog_lease(ttl)
        .min_replicas(1)
        .replica_timeout(REPLICA_TIMEOUT)
        .build()
        .unwrap();
    let guard = Lock::new("renewed").on(&backend).acquire().await.unwrap();
    replica.pause();
    let paused_at = Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("the lease was never reported lost");
    let after = paused_at.elapsed();
    let lock = common::SingleRedis::lock_key("renewed");
    let still_on_primary = read_cell(&primary, &lock).is_held();
    replica.resume();
    eprintln!(
        "SENTINEL replica paused under a {ttl:?} watchdog lease: lost after {after:?} ({lost}); \
         key still held on the primary: {still_on_primary}"
    );
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost}");
    assert!(after <= ttl, "the lease outlived its TTL: {after:?}");
    assert!(
        still_on_primary,
        "the primary applied the renewals (only their acknowledgement was missing)"
    );
}

/// A watchdog holder through a failover either keeps its lock on the new primary or learns it
/// lost it before anyone else can take it — never both holding. Two holders: one whose lease
/// (12 s) outlasts the failover and keeps it, even on a loaded machine (a failover there took
/// long enough to outlast a 6 s lease); one whose lease (700 ms) does not, and loses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_through_a_failover_keeps_its_lock_or_learns_it_lost_it_first() {
    let mut group = SentinelGroup::start_with_replicas(2, DOWN_AFTER);
    let long = sentinel_backend(&group.sentinel_url(), Duration::from_secs(12));
    let short = sentinel_backend(&group.sentinel_url(), Duration::from_millis(700));
    let contender = sentinel_backend(&group.sentinel_url(), Duration::from_secs(6));
    let keeper = Lock::new("keeps").on(&long).acquire().await.unwrap();
    let loser = Lock::new("loses").on(&short).acquire().await.unwrap();

    let contend = |key: &'static str| {
        let contender = contender.clone();
        tokio::spawn(async move {
            // The wait budget carries the contender through the failover's errors (retried
            // with backoff); a grant the replicas did not acknowledge (already waited for) is
            // asked for again.
            loop {
                match Lock::new(key)
                    .on(&contender)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await
                {
                    Ok(guard) => return (Instant::now(), guard),
                    Err(LockError::ReplicasNotAcknowledged { .. }) => continue,
                    Err(err) => panic!("the contender for {key} failed: {err}"),
                }
            }
        })
    };
    let takes_kept = contend("keeps");
    let takes_lost = contend("loses");
    let loser_lost = tokio::spawn(async move {
        let err = loser.lost().await;
        (Instant::now(), err)
    });

    let switched = tokio::task::spawn_blocking(move || {
        let switched = group.kill_primary_and_wait_failover();
        (group, switched)
    });
    let (group, switched) = switched.await.unwrap();

    // The short lease cannot outlive the failover: it is lost, and only then taken.
    let (lost_at, err) = tokio::time::timeout(Duration::from_secs(20), loser_lost)
        .await
        .expect("the short lease was never reported lost")
        .unwrap();
    let (taken_at, taken) = tokio::time::timeout(Duration::from_secs(30), takes_lost)
        .await
        .expect("the lost lock was never taken")
        .unwrap();
    assert!(err.is_lost(), "{err}");
    assert!(
        lost_at <= taken_at,
        "the contender got the lock {:?} before its holder learned it lost it",
        lost_at - taken_at
    );
    taken.release().await.unwrap();

    // The long lease outlives it: renewed on the new primary (its PEXPIRE seen there), still
    // held, still exclusive.
    let lock = common::SingleRedis::lock_key("keeps");
    let mut renewals = common::watch_key_events(group.primary(), &lock, "Kg").await;
    tokio::time::timeout(Duration::from_secs(10), renewals.on_message().next())
        .await
        .expect("the long lease was renewed on the new primary");
    assert!(keeper.is_held(), "{:?}", keeper.check());
    assert!(
        !takes_kept.is_finished(),
        "the kept lock was granted to a contender"
    );
    let holder = long
        .inspect("keeps")
        .await
        .unwrap()
        .expect("held on the new primary");
    assert_eq!(holder.fencing_token, keeper.fencing_token());
    eprintln!(
        "SENTINEL holder through a failover: switch after {switched:?}; the 12 s lease was kept \
         (token {}), the 700 ms lease was lost ({err}) and taken after",
        keeper.fencing_token()
    );
    keeper.release().await.unwrap();
    let (_, guard) = tokio::time::timeout(Duration::from_secs(10), takes_kept)
        .await
        .expect("released, the kept lock goes to its contender")
        .unwrap();
    guard.release().await.unwrap();
    drop(group);
}

/// A switch with the old primary alive (`SENTINEL FAILOVER`: demoted to a replica, its clients
/// still connected): the backend moves to the new primary, and a waiter subscribed on the old
/// one is woken by the release on the new one — its backoff (30 s here) is not what wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switch_with_the_old_primary_alive_moves_locks_and_waiters() {
    let mut group = SentinelGroup::start(DOWN_AFTER);
    let holder = Backend::builder(group.sentinel_url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    let waiter = Backend::builder(group.sentinel_url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    // Notifications alone wake it: a missed one shows as a 30 s wait.
    distlock::__private::raw::set_backoff_floor(&waiter, Duration::from_secs(30));
    let guard = Lock::new("moved").on(&holder).acquire().await.unwrap();
    let held_token = guard.fencing_token();
    let waiting = common::spawn_waiter(&waiter, "moved", Duration::from_secs(60));
    // The waiter subscribed (on the old primary) and waits.
    let old_primary = group.primary().port();
    common::until_subscribers(group.primary(), "moved", 1).await;

    let switched = tokio::task::spawn_blocking(move || {
        let switched = group.fail_over_and_wait();
        (group, switched)
    });
    let (group, switched) = switched.await.unwrap();
    assert_ne!(group.primary().port(), old_primary);
    // The move is each backend's answer to the sentinels' announcement, which reaches it on its
    // own connection, moments after the sentinels log it. A release sent before the holder heard
    // it would go to the old primary, which takes writes until the sentinels convert it, and be
    // lost with it — the lock on the new primary then lasts its TTL: Sentinel's async
    // replication, not the move this test is about.
    let heard = distlock::__private::raw::until_local(Duration::from_secs(10), async || {
        use distlock::__private::raw::switches_seen;
        switches_seen(&holder) >= 1 && switches_seen(&waiter) >= 1
    })
    .await;
    assert!(heard, "a backend did not hear the sentinels' announcement");
    // The holder's lock was replicated before the switch: still held, released on the new
    // primary, whose notification reaches the waiter.
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let acquired_at = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiter was not woken by the release on the new primary")
        .unwrap()
        .unwrap();
    let woken_after = acquired_at - released_at;
    let taken = waiter.inspect("moved").await.unwrap();
    eprintln!(
        "SENTINEL switch with the old primary alive: switched after {switched:?}; the waiter \
         got the lock {woken_after:?} after the release on the new primary"
    );
    assert!(taken.is_none(), "the waiter released it");
    // Without the move, the waiter is woken only when the sentinels convert the old primary
    // (their next INFO of it, 1 s apart here) and kill its pub/sub clients: 2 s in a run with
    // the move disabled.
    assert!(
        woken_after < Duration::from_millis(500),
        "the waiter stayed subscribed on the old primary: woken {woken_after:?} after the release"
    );
    // And the lock works on the new primary, with a newer token.
    let again = Lock::new("moved").on(&holder).acquire().await.unwrap();
    assert!(again.fencing_token() > held_token);
    again.release().await.unwrap();
}

/// A switch whose announcement never reached the backend: the demoted primary's sentinels
/// kill its clients (or, on a connection that survives, it answers `READONLY`), and the backend
/// asks the sentinels again and goes on on the new primary within the same call — it never
/// writes to the demoted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missed_switch_is_caught_by_the_demoted_primarys_refusal() {
    let mut group = SentinelGroup::start(DOWN_AFTER);
    let backend = Backend::builder(group.sentinel_url())
        .prefix(PREFIX)
        .build()
        .unwrap();
    distlock::__private::raw::ignore_switch_announcements(&backend);
    let before = Lock::new("demoted").on(&backend).acquire().await.unwrap();
    before.release().await.unwrap();
    let old_primary = group.primary().port();
    let switched = tokio::task::spawn_blocking(move || {
        let switched = group.fail_over_and_wait();
        (group, switched)
    });
    let (group, switched) = switched.await.unwrap();
    // The old primary is demoted once the sentinels reconfigure it (their next INFO of it).
    let old = group.replica();
    assert_eq!(old.port(), old_primary);
    old.wait_for_log("MASTER <-> REPLICA sync: Finished with success");

    // The first write goes to the demoted server's connection, fails, and is sent again to the
    // new primary within the same call (the wait budget carries it).
    let started = Instant::now();
    let guard = Lock::new("demoted")
        .on(&backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let took = started.elapsed();
    let lock = common::SingleRedis::lock_key("demoted");
    assert!(
        read_cell(group.primary(), &lock).is_held(),
        "the lock is on the new primary"
    );
    let readonly = error_count(old, "READONLY");
    eprintln!(
        "SENTINEL missed switch: switched after {switched:?}; the next acquire met {readonly} \
         READONLY and was granted on the new primary after {took:?}"
    );
    assert_eq!(
        old.command(&["EXISTS", &lock]),
        Reply::Int(1),
        "replicated from the new primary"
    );
    guard.release().await.unwrap();
}

/// Every replica and Sentinel setting that cannot work is refused by `build`, naming itself and
/// what to do — nothing is silently ignored.
#[test]
fn replica_and_sentinel_settings_that_cannot_work_are_refused() {
    let refused = |builder: distlock::BackendBuilder| builder.build().unwrap_err().to_string();
    let masters = ["redis://a:1", "redis://b:1", "redis://c:1"];
    let err = refused(Backend::redlock(masters).min_replicas(1));
    assert!(err.contains("min_replicas is 1 for Redlock"), "{err}");
    let err = refused(Backend::builder("memory://").min_replicas(2));
    assert!(
        err.contains("min_replicas is 2 for the in-process backend"),
        "{err}"
    );
    let err = refused(Backend::builder("redis://a:1").replica_timeout(REPLICA_TIMEOUT));
    assert!(
        err.contains("replica_timeout is set (200ms) but min_replicas is 0"),
        "{err}"
    );
    // Redisson's 1 s replica wait works as it is: the acknowledged reply may take the replica
    // timeout on top of the response timeout.
    Backend::builder("redis://a:1")
        .min_replicas(1)
        .replica_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let err = refused(
        Backend::builder("redis://a:1")
            .min_replicas(1)
            .watchdog_lease(Duration::from_secs(1))
            .replica_timeout(Duration::from_millis(400)),
    );
    assert!(
        err.contains("replica_timeout is 400ms; it must be at least 1ms and less than a third of watchdog_lease (1s)"),
        "{err}"
    );
    let err =
        refused(Backend::builder("redis-sentinel://a:1/primary").tls_ca_pem(b"not used".to_vec()));
    assert!(err.contains("use rediss-sentinel://"), "{err}");
    for (url, problem) in [
        ("redis-sentinel://a:1", "names no master"),
        (
            "redis-sentinel://a:1/primary?timeout=1",
            "unknown setting `timeout`",
        ),
        (
            "redis-sentinel://u:hunter2@a:1/primary?sentinel_password=hunter3&db=x",
            "gives `db=x`",
        ),
    ] {
        let err = refused(Backend::builder(url));
        assert!(err.contains(problem), "{url}: {err}");
        assert!(!err.contains("hunter"), "a password leaked: {err}");
    }
    let err = refused(Backend::redlock([
        "redis://a:1",
        "redis-sentinel://b:1/primary",
        "redis://c:1",
    ]));
    assert!(err.contains("is not a Redis URL"), "{err}");
    // A replica-acknowledged primary at a plain address, and the defaults, build.
    Backend::builder("redis://a:1")
        .min_replicas(1)
        .build()
        .unwrap();
    Backend::sentinel(["a:1", "b:2"], "primary")
        .build()
        .unwrap();
    // A master name with characters a URL path would end at is escaped, not misread.
    Backend::sentinel(["a:1"], "odd/name?x#1%").build().unwrap();
    Backend::builder("redis-sentinel://a,b:26380/primary?db=2")
        .min_replicas(2)
        .watchdog_lease(Duration::from_millis(300))
        .build()
        .unwrap();
}

/// `errorstat_<kind>` of `INFO errorstats`: how often the server answered with that error.
fn error_count(server: &RedisServer, kind: &str) -> u64 {
    let info = server.command(&["INFO", "errorstats"]).as_str().unwrap();
    let prefix = format!("errorstat_{kind}:count=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |count| count.trim().parse().unwrap())
}
