//! The PostgreSQL engine under faults and inside the application's own transactions, on
//! servers the harness starts per test (PgBouncer in front where a test says so): the lock
//! connections ended and the server crashed under load from several processes, a holder
//! paused past its lease, a holder paused inside its fenced transaction, a client whose wall
//! clock is hours off, a pool of one connection, cancelled fenced writes, a missing schema.
//! A separate Redis (the resource) records the sections of the multi-process tests and fences
//! their writes; the application's own table `resource` records the fenced writes in
//! PostgreSQL.
//!
//! Figures are printed as `POSTGRES …` lines on stderr.

mod common;

use common::postgres::{until_on_postgres, SCHEMA};
use common::sections::{self, Tally};
use common::worker::{self, Worker};
use common::{Postgres, PREFIX};
use distlock::{Backend, Check, Lock, LockError, LostReason};
use distlock_test_support::{PgBouncer, PgServer, PoolMode, RedisServer};
use sqlx::postgres::{PgListener, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};
use std::time::{Duration, Instant};

const PROCESSES: usize = 3;
/// The paused holders' watchdog lease.
const HOLDER_LEASE: Duration = Duration::from_secs(1);

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    worker::runtime().block_on(async move {
        match role.as_str() {
            "sections" => sections::run().await,
            "hold" => hold().await,
            "hold_in_transaction" => hold_in_transaction().await,
            "skewed" => skewed().await,
            "hold_and_die" => hold_and_die().await,
            other => panic!("unknown worker role {other}"),
        }
    });
}

fn backend(url: &str, lease: Duration) -> Backend {
    Backend::builder(url)
        .prefix(PREFIX)
        .watchdog_lease(lease)
        .build()
        .unwrap()
}

/// The application's table the fenced writes go to: one row, its value and the highest token
/// that wrote it.
fn create_resource(server: &PgServer) {
    server.psql(
        "CREATE TABLE resource (id int PRIMARY KEY, fence bigint NOT NULL, value text NOT NULL); \
         INSERT INTO resource VALUES (1, 0, 'none')",
    );
}

/// The recipe for a table of the application's own: the write names its token and applies
/// only if no newer token wrote the row. Answers the rows written (0 or 1).
async fn write_with_token(pool: &PgPool, token: u64, value: &str) -> u64 {
    sqlx::query("UPDATE resource SET fence = $1, value = $2 WHERE id = 1 AND fence <= $1")
        .bind(token as i64)
        .bind(value)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
}

fn resource_value(server: &PgServer) -> String {
    server.psql("SELECT value || ' ' || fence FROM resource WHERE id = 1")
}

/// How many sessions are in a transaction they have not ended (`idle in transaction`).
fn open_transactions(server: &PgServer) -> usize {
    server
        .psql(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()",
        )
        .parse()
        .unwrap()
}

/// Live lock rows (holders and waiters) under the tests' prefix.
fn live_rows(server: &PgServer) -> usize {
    server
        .psql(&format!(
            "SELECT count(*) FROM {SCHEMA}.entries \
             WHERE key LIKE '{PREFIX}:%' AND expires_at > clock_timestamp()"
        ))
        .parse()
        .unwrap()
}

/// 3 processes × 4 tasks loop fenced sections on one key; every lock connection is ended
/// three times (`pg_terminate_backend`), then PostgreSQL crashes (immediate shutdown) and is
/// started again. Every section completes, none overlaps, no token goes back across the
/// crash, the fence rejects nothing.
#[test]
fn connections_ended_and_the_server_crashed_under_load_never_overlap_or_go_back() {
    let mut server = Postgres::server();
    let resource = RedisServer::start();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|index| {
            let env = sections::worker_env(&server.url(), &resource, index);
            Worker::spawn("worker_entry", "sections", &env)
        })
        .collect();
    worker::start_together(&mut workers);
    sections::wait_for_tokens(&resource, 100);

    let mut ended = 0;
    for _ in 0..3 {
        let at = sections::tokens_len(&resource);
        ended += server.terminate_connections("postgres");
        sections::wait_for_tokens(&resource, at + 50);
    }
    let before_crash = sections::tokens_len(&resource);
    let crashed_at = Instant::now();
    server.kill();
    server.restart();
    let restarted = crashed_at.elapsed();
    for worker in &mut workers {
        worker.send("killed");
    }
    sections::wait_for_tokens(&resource, before_crash + 100);
    let resumed = crashed_at.elapsed();

    let total = Tally::collect(&mut workers);
    let tokens = sections::tokens(&resource);
    let regressions = sections::regressions(&tokens);
    eprintln!(
        "POSTGRES faults under load: {PROCESSES} processes x {} tasks, {} sections; {ended} lock \
         connections ended in 3 rounds, then the server crashed after {before_crash} sections \
         (up again {restarted:?} later, 100 more sections {resumed:?} after the crash, {} after \
         it in all); {} overlaps, {regressions} token regressions, {} fenced writes rejected, \
         {} errors",
        sections::TASKS,
        total.sections,
        total.after_kill,
        total.overlaps,
        total.rejected,
        total.errors,
    );
    assert!(ended >= PROCESSES, "the lock connections were ended");
    assert_eq!(total.overlaps, 0, "critical sections overlapped");
    assert_eq!(regressions, 0, "fencing tokens went back");
    assert_eq!(total.rejected, 0, "a fenced write was rejected");
    assert_eq!(total.errors, 0, "a section did not complete");
    assert_eq!(tokens.len() as u64, total.sections);
}

/// Takes the lock `held` with a 1 s watchdog lease, reports its token, and waits for the
/// parent (which stops and continues it meanwhile); then reports its checkpoint, what the
/// same-transaction fence says, and how many rows its late write by the recipe changed.
async fn hold() {
    let url = std::env::var("LOCK_URL").unwrap();
    let backend = backend(&url, HOLDER_LEASE);
    let app = PgPool::connect(&url).await.unwrap();
    let _ = Lock::new("held")
        .on(&backend)
        .run(async {
            let token = distlock::fencing_token().unwrap();
            worker::report("acquired", token);
            let order = tokio::task::spawn_blocking(worker::read_line)
                .await
                .unwrap();
            assert_eq!(order, "go");
            let check = match distlock::checkpoint() {
                Ok(()) => "held".to_owned(),
                Err(err) => format!("lost {:?}", err.lost_reason()),
            };
            worker::report("checkpoint", check);
            let mut transaction = app.begin().await.unwrap();
            let fenced = distlock::postgres::fence(&mut transaction).await;
            worker::report(
                "fence",
                format!("{:?}", fenced.map_err(|e| e.lost_reason())),
            );
            transaction.rollback().await.unwrap();
            worker::report("recipe", write_with_token(&app, token, "late write").await);
        })
        .await;
}

/// A holder stopped (SIGSTOP) while its watchdog keeps a 1 s lease: another process takes the
/// lock only after the holder's validity ended, with a larger token, and writes the table in
/// a fenced transaction and by the recipe; on SIGCONT the holder's checkpoint says the lease
/// expired, its same-transaction fence refuses, and its late write by the recipe changes
/// nothing.
#[test]
fn a_paused_holder_wakes_up_lost_and_its_late_writes_are_refused() {
    let server = Postgres::server();
    create_resource(&server);
    let mut holder = Worker::spawn("worker_entry", "hold", &[("LOCK_URL", server.url())]);
    let stale: u64 = holder
        .expect("acquired", Duration::from_secs(30))
        .parse()
        .unwrap();
    holder.signal(libc::SIGSTOP);
    let stopped_at = Instant::now();

    let runtime = worker::runtime();
    let (fresh, taken_after) = runtime.block_on(async {
        let taker = backend(&server.url(), Duration::from_secs(5));
        let guard = Lock::new("held")
            .on(&taker)
            .wait(Duration::from_secs(10))
            .acquire()
            .await
            .unwrap();
        let taken_after = stopped_at.elapsed();
        let app = PgPool::connect(&server.url()).await.unwrap();
        let mut transaction = app.begin().await.unwrap();
        distlock::postgres::fence_guard(&guard, &mut transaction)
            .await
            .unwrap();
        sqlx::query("UPDATE resource SET value = 'new holder, fenced' WHERE id = 1")
            .execute(&mut *transaction)
            .await
            .unwrap();
        transaction.commit().await.unwrap();
        let token = guard.fencing_token();
        assert_eq!(write_with_token(&app, token, "new holder").await, 1);
        guard.release().await.unwrap();
        (token, taken_after)
    });
    holder.signal(libc::SIGCONT);
    holder.send("go");
    let checkpoint = holder.expect("checkpoint", Duration::from_secs(30));
    let fence = holder.expect("fence", Duration::from_secs(30));
    let recipe = holder.expect("recipe", Duration::from_secs(30));
    assert!(holder.wait().success());
    let value = resource_value(&server);
    eprintln!(
        "POSTGRES pause: holder with a {HOLDER_LEASE:?} watchdog lease stopped; lock taken over \
         after {taken_after:?} with token {fresh} (the holder's {stale}); on SIGCONT its \
         checkpoint said `{checkpoint}`, its fenced transaction `{fence}`, its late write by \
         the recipe changed {recipe} rows; the table holds `{value}`"
    );
    assert!(fresh > stale, "the new holder's token is larger");
    let least = HOLDER_LEASE * 2 / 3 - HOLDER_LEASE / 100 - Duration::from_millis(2);
    assert!(
        taken_after >= least,
        "taken over {taken_after:?} after the stop, while the holder could still believe it \
         held the lock (its validity lasts at least {least:?} past the stop)"
    );
    assert_eq!(checkpoint, "lost Some(Expired)");
    assert_eq!(fence, "Err(Some(Expired))");
    assert_eq!(recipe, "0");
    assert_eq!(value, format!("new holder {fresh}"));
}

/// Takes the lock `held` with a 1 s watchdog lease, opens a transaction and fences it, reports
/// `fenced` with its token, waits for the parent's `go` (stopped and continued meanwhile),
/// then writes the table in that transaction and commits it.
async fn hold_in_transaction() {
    let url = std::env::var("LOCK_URL").unwrap();
    let backend = backend(&url, HOLDER_LEASE);
    let app = PgPool::connect(&url).await.unwrap();
    let _ = Lock::new("held")
        .on(&backend)
        .run(async {
            let mut transaction = app.begin().await.unwrap();
            distlock::postgres::fence(&mut transaction).await.unwrap();
            let token = distlock::fencing_token().unwrap();
            worker::report("fenced", token);
            let order = tokio::task::spawn_blocking(worker::read_line)
                .await
                .unwrap();
            assert_eq!(order, "go");
            sqlx::query("UPDATE resource SET value = 'old holder', fence = $1 WHERE id = 1")
                .bind(token as i64)
                .execute(&mut *transaction)
                .await
                .unwrap();
            transaction.commit().await.unwrap();
            worker::report("committed", "");
        })
        .await;
}

/// A holder stopped inside its fenced transaction: its lease runs out in the database, yet
/// nobody is granted the lock while the transaction is open (three leases); continued, it
/// commits, and only then the waiting process is granted the lock, and finds the old holder's
/// write committed. The takeover waited for the transaction.
#[test]
fn a_takeover_waits_for_the_holders_fenced_transaction() {
    let server = Postgres::server();
    create_resource(&server);
    let mut holder = Worker::spawn(
        "worker_entry",
        "hold_in_transaction",
        &[("LOCK_URL", server.url())],
    );
    let stale: u64 = holder
        .expect("fenced", Duration::from_secs(30))
        .parse()
        .unwrap();
    holder.signal(libc::SIGSTOP);

    let runtime = worker::runtime();
    let taker = backend(&server.url(), Duration::from_secs(5));
    let lock = format!("{PREFIX}:{{held}}");
    let mut acquire = runtime.spawn({
        let taker = taker.clone();
        async move {
            let guard = Lock::new("held")
                .on(&taker)
                .wait(Duration::from_secs(30))
                .acquire()
                .await
                .unwrap();
            (guard, Instant::now())
        }
    });
    let held_while_open = runtime.block_on(async {
        let expired = until_on_postgres(&server, Duration::from_secs(10), async || {
            server.psql(&format!(
                "SELECT count(*) FROM {SCHEMA}.entries \
                 WHERE key = '{lock}' AND token = {stale} AND expires_at > clock_timestamp()"
            )) == "0"
        })
        .await;
        assert!(
            expired,
            "the stopped holder's lease ran out in the database"
        );
        tokio::time::timeout(HOLDER_LEASE * 3, &mut acquire)
            .await
            .map(Result::unwrap)
    });
    if let Ok((guard, _)) = &held_while_open {
        panic!(
            "granted (token {}) while the holder's fenced transaction was open",
            guard.fencing_token()
        );
    }
    holder.signal(libc::SIGCONT);
    let continued_at = Instant::now();
    holder.send("go");
    holder.expect("committed", Duration::from_secs(30));
    let (guard, granted_at) = runtime.block_on(acquire).unwrap();
    let value = resource_value(&server);
    let fresh = guard.fencing_token();
    runtime.block_on(guard.release()).unwrap();
    assert!(holder.wait().success());
    eprintln!(
        "POSTGRES fenced transaction: holder (token {stale}) stopped inside it, its lease run \
         out in the database; not granted to the waiter in {:?} while it was open; granted \
         {:?} after the holder continued, with token {fresh}, finding `{value}`",
        HOLDER_LEASE * 3,
        granted_at - continued_at,
    );
    assert_eq!(
        value,
        format!("old holder {stale}"),
        "the old holder's write committed before the grant"
    );
    assert!(fresh > stale);
}

/// The lock row deleted behind the holder's back (an operator's force-unlock, then another
/// holder): the holder's own clock still says it holds the lock, but the database refuses its
/// fenced transaction, naming the lock gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_is_refused_once_the_lock_row_is_gone() {
    let server = Postgres::server();
    let app = PgPool::connect(&server.url()).await.unwrap();
    let holder = backend(&server.url(), Duration::from_secs(30));
    let guard = Lock::new("taken").on(&holder).acquire().await.unwrap();
    let mut transaction = app.begin().await.unwrap();
    distlock::postgres::fence_guard(&guard, &mut transaction)
        .await
        .unwrap();
    transaction.commit().await.unwrap();

    let operator = backend(&server.url(), Duration::from_secs(30));
    assert!(operator.force_unlock("taken").await.unwrap().is_some());
    let other = Lock::new("taken").on(&operator).acquire().await.unwrap();
    assert!(guard.is_held(), "its own clock still says held");
    let mut transaction = app.begin().await.unwrap();
    let refused = distlock::postgres::fence_guard(&guard, &mut transaction).await;
    transaction.rollback().await.unwrap();
    eprintln!("POSTGRES force-unlocked holder's fenced transaction: {refused:?}");
    assert!(
        matches!(
            refused,
            Err(LockError::Lost {
                reason: LostReason::Gone,
                ..
            })
        ),
        "{refused:?}"
    );
    let mut transaction = app.begin().await.unwrap();
    distlock::postgres::fence_guard(&other, &mut transaction)
        .await
        .unwrap();
    transaction.commit().await.unwrap();
    other.release().await.unwrap();
    let _ = guard.release().await;
}

/// The recipe's rule, on its own: a write names its token and applies only while no newer
/// token wrote the row; the same holder may write again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recipe_applies_a_write_only_while_no_newer_token_wrote() {
    let server = PgServer::start();
    create_resource(&server);
    let app = PgPool::connect(&server.url()).await.unwrap();
    assert_eq!(write_with_token(&app, 7, "seven").await, 1);
    assert_eq!(write_with_token(&app, 7, "seven again").await, 1);
    assert_eq!(write_with_token(&app, 9, "nine").await, 1);
    assert_eq!(write_with_token(&app, 8, "eight, late").await, 0);
    assert_eq!(resource_value(&server), "nine 9");
}

/// Holds `clock-held`, then asks for `clock-wanted` (which the parent holds) and later is
/// granted it — all with a wall clock `FAKETIME` away from the database's.
async fn skewed() {
    let backend = backend(&std::env::var("LOCK_URL").unwrap(), HOLDER_LEASE);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    worker::report("clock", now.as_secs());
    let guard = Lock::new("clock-held")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    worker::report("acquired", guard.fencing_token());
    let order = tokio::task::spawn_blocking(worker::read_line)
        .await
        .unwrap();
    assert_eq!(order, "release");
    worker::report("check", format!("{:?}", guard.check()));
    worker::report(
        "release",
        format!("{:?}", guard.release().await.map(|_| ())),
    );
    let refused = Lock::new("clock-wanted")
        .on(&backend)
        .wait(HOLDER_LEASE * 3)
        .acquire()
        .await;
    worker::report("wanted", format!("{:?}", refused.map(|_| ())));
    let order = tokio::task::spawn_blocking(worker::read_line)
        .await
        .unwrap();
    assert_eq!(order, "go");
    let granted = Lock::new("clock-wanted")
        .on(&backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await;
    worker::report("granted", format!("{:?}", granted.map(|g| g.is_held())));
}

/// libfaketime's preload library, from the `faketime` package.
fn libfaketime() -> String {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
        "/usr/lib/faketime/libfaketime.so.1",
    ];
    candidates
        .iter()
        .find(|path| std::path::Path::new(path).exists())
        .unwrap_or_else(|| {
            panic!(
                "libfaketime not found; install it (`apt-get install faketime`, as \
                 scripts/deps.sh does)"
            )
        })
        .to_string()
}

/// A process whose wall clock is three hours ahead, then one three hours behind, against this
/// one: it holds a lock through many renewals which nobody else is granted (three leases of
/// asking), and asks for one held here without being granted it (three leases), then is
/// granted it once released. Lease time is the database's; the holder's validity its
/// monotonic clock's.
#[test]
fn a_client_clock_hours_off_neither_steals_nor_loses_a_lock() {
    let server = Postgres::server();
    let runtime = worker::runtime();
    let here = backend(&server.url(), HOLDER_LEASE);
    for offset in ["+3h", "-3h"] {
        let mut skewed = Worker::spawn(
            "worker_entry",
            "skewed",
            &[
                ("LOCK_URL", server.url()),
                ("LD_PRELOAD", libfaketime()),
                ("FAKETIME", offset.to_owned()),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
            ],
        );
        let their_clock: i64 = skewed
            .expect("clock", Duration::from_secs(30))
            .parse()
            .unwrap();
        let ours = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        let skew = their_clock - ours;
        assert!(
            (skew.abs() - 3 * 3600).abs() < 600,
            "the worker's clock is {skew} s off ours: faketime did not take"
        );
        skewed.expect("acquired", Duration::from_secs(30));
        let stolen = runtime.block_on(
            Lock::new("clock-held")
                .on(&here)
                .wait(HOLDER_LEASE * 3)
                .acquire(),
        );
        let guard = runtime
            .block_on(Lock::new("clock-wanted").on(&here).acquire())
            .unwrap();
        skewed.send("release");
        let check = skewed.expect("check", Duration::from_secs(30));
        let release = skewed.expect("release", Duration::from_secs(30));
        let wanted = skewed.expect("wanted", Duration::from_secs(30));
        let kept = guard.check();
        runtime.block_on(guard.release()).unwrap();
        skewed.send("go");
        let granted = skewed.expect("granted", Duration::from_secs(30));
        assert!(skewed.wait().success());
        eprintln!(
            "POSTGRES clock {offset} ({skew} s): held through 3 leases, asked for here: {:?}; \
             its check {check}, release {release}; it asked for ours for 3 leases: {wanted}, \
             ours still {kept:?}; granted once released: {granted}",
            stolen.as_ref().map(|_| ()),
        );
        assert!(matches!(stolen, Err(LockError::Busy { .. })), "{stolen:?}");
        assert_eq!(check, "Ok(())");
        assert_eq!(release, "Ok(())");
        assert!(wanted.starts_with("Err(Busy"), "{wanted}");
        assert!(kept.is_ok());
        assert_eq!(granted, "Ok(true)");
    }
}

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
    tokio::task::spawn_blocking(worker::read_line)
        .await
        .unwrap();
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
    let open = open_transactions(&server);
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

/// The application's pool has one connection, and the body holds it in a fenced transaction
/// while a nested lock is taken and the watchdog renews the lease (its renewal told on the
/// schema's channel): the lock's connections are distlock's own, so nothing waits for the
/// body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_connection_shared_by_the_body_and_the_lock_does_not_deadlock() {
    let server = Postgres::server();
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .unwrap();
    let backend = Backend::postgres(&pool)
        .prefix(PREFIX)
        .watchdog_lease(HOLDER_LEASE)
        .build()
        .unwrap();
    let mut listener = PgListener::connect(&server.url()).await.unwrap();
    listener.listen(SCHEMA).await.unwrap();
    let body = Lock::new("one").on(&backend).run(async {
        let mut transaction = pool.begin().await.unwrap();
        distlock::postgres::fence(&mut transaction).await.unwrap();
        Lock::new("two")
            .on(&backend)
            .run(async {
                distlock::postgres::fence(&mut transaction).await.unwrap();
            })
            .await
            .unwrap();
        let renewed = format!("r\t{PREFIX}:{{one}}\t");
        loop {
            let told = listener.recv().await.unwrap();
            if told.payload().starts_with(&renewed) {
                break;
            }
        }
        sqlx::query("SELECT 1")
            .execute(&mut *transaction)
            .await
            .unwrap();
        transaction.commit().await.unwrap();
    });
    let done = tokio::time::timeout(Duration::from_secs(20), body).await;
    eprintln!("POSTGRES pool of one: {done:?}");
    assert!(
        matches!(done, Ok(Ok(()))),
        "the body and the lock deadlocked: {done:?}"
    );
}

/// 600 locked calls, each a fenced transaction that writes the table, cancelled at spread
/// points (waiting, holding, inside the fence, committing, releasing). Afterwards no lock row
/// is live (each cancelled holder's release runs on) and no session is left in a transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_fenced_writes_leave_no_row_held_and_no_transaction_open() {
    let server = Postgres::server();
    create_resource(&server);
    let app = PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .unwrap();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let mut completed = 0;
    for i in 0..600u64 {
        let call = Lock::new(format!("cancel-{}", i % 4))
            .on(&backend)
            .run(async {
                let mut transaction = app.begin().await.unwrap();
                distlock::postgres::fence(&mut transaction).await.unwrap();
                sqlx::query("UPDATE resource SET value = 'written' WHERE id = 1")
                    .execute(&mut *transaction)
                    .await
                    .unwrap();
                transaction.commit().await.unwrap();
            });
        let after = Duration::from_micros(i * 7_919 % 6_000);
        completed += u64::from(tokio::time::timeout(after, call).await.is_ok());
    }
    // Every connection of the application's pool, taken: each cancelled transaction's
    // connection has been given back (rolled back) by then.
    let mut taken = Vec::new();
    for _ in 0..4 {
        taken.push(app.acquire().await.unwrap());
    }
    let open = open_transactions(&server);
    drop(taken);
    let released = until_on_postgres(&server, Duration::from_secs(10), async || {
        live_rows(&server) == 0
    })
    .await;
    eprintln!(
        "POSTGRES cancelled fenced writes: 600 calls, {completed} completed, the rest \
         cancelled; {open} sessions left in a transaction; every lock row gone: {released}"
    );
    assert!(completed > 0 && completed < 600, "the cancel points spread");
    assert_eq!(open, 0, "a cancelled fenced transaction was left open");
    assert!(released, "a cancelled call left its lock row held");
}

/// A database without the schema: `ping` names what to run; with `create_schema` the backend
/// creates it at first use and locks work. The doctor names the harness's `fsync = off`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_named_and_created_only_when_asked() {
    let server = PgServer::start();
    let plain = Backend::builder(server.url())
        .schema("app_locks")
        .build()
        .unwrap();
    let err = plain.ping().await.unwrap_err().to_string();
    assert!(
        err.contains("no distlock schema `app_locks`")
            && err.contains("distlock schema postgres --schema app_locks"),
        "{err}"
    );
    assert_eq!(
        server.psql("SELECT count(*) FROM pg_namespace WHERE nspname = 'app_locks'"),
        "0",
        "nothing was created unasked"
    );
    let creating = Backend::builder(server.url())
        .schema("app_locks")
        .create_schema(true)
        .build()
        .unwrap();
    creating.ping().await.unwrap();
    Lock::new("after")
        .on(&creating)
        .run(async {})
        .await
        .unwrap();
    plain.ping().await.unwrap();
    let findings = creating.doctor().await.unwrap();
    eprintln!("POSTGRES missing schema: {err}; doctor: {findings:?}");
    assert!(
        findings
            .iter()
            .any(|f| f.check == Check::Persistence && f.advice.contains("fsync is off")),
        "{findings:?}"
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
    let err = Lock::new("on-standby")
        .on(&backend)
        .wait(Duration::ZERO)
        .run(async {})
        .await
        .unwrap_err()
        .to_string();
    eprintln!("POSTGRES standby: {err}");
    assert!(err.contains("point the backend at the primary"), "{err}");
}

/// One connection of the application, ended while it is in a fenced transaction: the
/// transaction is gone with it (nothing committed), and the lock is still held and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_whose_connection_drops_commits_nothing() {
    let server = Postgres::server();
    create_resource(&server);
    let backend = backend(&server.url(), Duration::from_secs(5));
    let mut connection = PgConnection::connect(&server.url()).await.unwrap();
    let guard = Lock::new("dropped").on(&backend).acquire().await.unwrap();
    let mut transaction = connection.begin().await.unwrap();
    distlock::postgres::fence_guard(&guard, &mut transaction)
        .await
        .unwrap();
    sqlx::query("UPDATE resource SET value = 'uncommitted' WHERE id = 1")
        .execute(&mut *transaction)
        .await
        .unwrap();
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *transaction)
        .await
        .unwrap();
    server.psql(&format!("SELECT pg_terminate_backend({pid})"));
    assert!(transaction.commit().await.is_err());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert_eq!(resource_value(&server), "none 0");
}
