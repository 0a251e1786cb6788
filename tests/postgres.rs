//! The PostgreSQL engine under faults and inside the application's own transactions, on
//! servers the harness starts per test (PgBouncer in front where a test says so): the tests
//! written once for PostgreSQL and MySQL (`sql_faults`), called here on PostgreSQL under their
//! names, and those of PostgreSQL's own: locks through PgBouncer in transaction mode, a standby.
//!
//! Figures are printed as `POSTGRES …` lines on stderr.

mod common;
mod sql_faults;

use common::database::Database;
use common::sections::{self, Tally};
use common::worker::{self, Worker};
use common::Postgres;
use distlock::{Check, Lock};
use distlock_test_support::{PgBouncer, PgServer, PoolMode, RedisServer};
use sql_faults::{backend, PROCESSES};
use std::time::{Duration, Instant};

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    worker::runtime().block_on(async move {
        match role.as_str() {
            "hold_and_die" => hold_and_die().await,
            shared => sql_faults::play::<PgServer>(shared).await,
        }
    });
}

// The tests written once for PostgreSQL and MySQL, on PostgreSQL: its lock connections ended by
// `pg_terminate_backend`, its crash an immediate shutdown.
sql_faults::tests_on!(
    PgServer,
    connections_ended_and_the_server_crashed_under_load_never_overlap_or_go_back
);

/// Takes `counter` (waiting its turn among the sections), reports `holding`, and waits to be
/// killed.
async fn hold_and_die() {
    let url = std::env::var("LOCK_URL").unwrap();
    let lease = Duration::from_millis(std::env::var("LEASE_MS").unwrap().parse().unwrap());
    let guard = Lock::new("counter")
        .on(&backend(&url, lease))
        .wait(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    worker::report("holding", guard.fencing_token());
    worker::order().await;
    panic!("the holder was to be killed");
}

/// Through PgBouncer in transaction mode (no LISTEN, a server connection per transaction):
/// 3 processes × 4 tasks with 2 s watchdog leases loop fenced sections; a fourth process takes
/// the lock in turn and is killed (SIGKILL) while it holds it. Its row expires within its
/// lease and the others go on; nothing overlaps, no token goes back, no session is left
/// `idle in transaction`.
#[test]
fn through_pgbouncer_in_transaction_mode_nothing_overlaps_or_is_stranded() {
    let server = Postgres::server();
    let bouncer = PgBouncer::start(&server, PoolMode::Transaction);
    let resource = RedisServer::start();
    let lease = Duration::from_secs(2);
    let lease_ms = ("LEASE_MS", lease.as_millis().to_string());
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|index| {
            let mut env = sections::worker_env(&bouncer.url(), &resource, index);
            env.push(lease_ms.clone());
            Worker::spawn("worker_entry", "sections", &env)
        })
        .collect();
    let started = worker::start_together(&mut workers);
    sections::wait_for_tokens(&resource, 100);
    let first_100 = started.elapsed();
    let mut victim = Worker::spawn(
        "worker_entry",
        "hold_and_die",
        &[("LOCK_URL", bouncer.url()), lease_ms],
    );
    victim.expect("holding", Duration::from_secs(30));
    victim.signal(libc::SIGKILL);
    let killed_at = Instant::now();
    victim.wait();
    let at_kill = sections::tokens_len(&resource);
    sections::wait_for_tokens(&resource, at_kill + 1);
    let stalled = killed_at.elapsed();
    sections::wait_for_tokens(&resource, at_kill + 100);
    let next_100 = killed_at.elapsed() - stalled;
    let total = Tally::collect(&mut workers);
    let tokens = sections::tokens(&resource);
    let regressions = sections::regressions(&tokens);
    let open = server.open_transactions();
    eprintln!(
        "POSTGRES through PgBouncer (transaction mode): {PROCESSES} processes x {} tasks, {} \
         sections, the first 100 in {first_100:?}; a holder killed after {at_kill}: the next \
         section {stalled:?} later (its lease {lease:?}), 100 more in {next_100:?}; {} \
         overlaps, {regressions} token regressions, {} fenced writes rejected, {} errors; \
         {open} sessions idle in transaction",
        sections::TASKS,
        total.sections,
        total.overlaps,
        total.rejected,
        total.errors,
    );
    assert_eq!(total.overlaps, 0, "critical sections overlapped");
    assert_eq!(regressions, 0, "fencing tokens went back");
    assert_eq!(total.rejected, 0, "a fenced write was rejected");
    assert_eq!(total.errors, 0, "a section did not complete");
    assert_eq!(open, 0, "a session was left idle in transaction");
    assert!(
        stalled <= lease + Duration::from_millis(500),
        "the killed holder's lock outlived its lease: the next section came {stalled:?} after \
         the kill"
    );
}

/// A standby takes no lock: the doctor says it is one, and a lock names the primary as the
/// place to point at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_named_by_the_doctor_and_refuses_locks() {
    let primary = Postgres::server();
    let standby = PgServer::standby_of(&primary, "standby");
    let backend = backend(&standby.url(), Duration::from_secs(5));
    let findings = backend.doctor().await.unwrap();
    assert!(
        findings.iter().any(|f| f.check == Check::Standby),
        "{findings:?}"
    );
    let err = sql_faults::refused(&backend, "on-standby").await;
    eprintln!("POSTGRES standby: {err}");
    assert!(err.contains("point the backend at the primary"), "{err}");
}
