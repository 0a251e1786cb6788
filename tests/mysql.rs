//! The MySQL engine on MariaDB under faults and inside the application's own transactions, on
//! servers the harness starts per test: the lock connections ended and the server crashed under
//! load from several processes, a holder paused past its lease, a holder paused inside its
//! fenced transaction, a client whose wall clock is hours off, sessions in other time zones, a
//! pool of one connection, cancelled fenced writes, long and non-ASCII keys, a missing schema, a
//! read-only server, a lock user without its grants.
//! A separate Redis (the resource) records the sections of the multi-process tests and fences
//! their writes; the application's own table `resource` (in the database `test`) records the
//! fenced writes in MariaDB.
//!
//! Figures are printed as `MYSQL …` lines on stderr.

mod common;

use common::mysql::{until_on_mysql, SCHEMA};
use common::sections::{self, Tally};
use common::worker::{self, Worker};
use common::{Mysql, PREFIX};
use distlock::{Backend, Check, Lock, LockError, LostReason};
use distlock_test_support::{MariaDbServer, RedisServer};
use sqlx::mysql::MySqlPoolOptions;
use sqlx::{Connection, MySqlConnection, MySqlPool};
use std::time::{Duration, Instant};

const PROCESSES: usize = 3;
/// The paused holders' watchdog lease.
const HOLDER_LEASE: Duration = Duration::from_secs(1);
/// The watchdog lease of holders that must keep their lock through renewals: one renewal may
/// come 1.3 s late on a busy machine (a 1 s lease would be lost to a 650 ms stall).
const KEPT_LEASE: Duration = Duration::from_secs(2);
/// The longest lock name the lock table's `lock_key` column holds, in bytes.
const MAX_LOCK_NAME: usize = 2048;

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
fn create_resource(server: &MariaDbServer) {
    server.sql(
        "CREATE TABLE resource (id INT PRIMARY KEY, fence BIGINT NOT NULL, \
         value VARCHAR(100) NOT NULL) ENGINE = InnoDB; \
         INSERT INTO resource VALUES (1, 0, 'none')",
    );
}

/// The recipe for a table of the application's own: the write names its token and applies
/// only if no newer token wrote the row. Answers the rows written (0 or 1).
async fn write_with_token(pool: &MySqlPool, token: u64, value: &str) -> u64 {
    sqlx::query("UPDATE resource SET fence = ?, value = ? WHERE id = 1 AND fence <= ?")
        .bind(token)
        .bind(value)
        .bind(token)
        .execute(pool)
        .await
        .unwrap()
        .rows_affected()
}

/// A write of `value` in the application's own transaction, fenced as the guide says: written
/// and committed when the fence lets the transaction through, rolled back when it refuses.
/// Answers what the fence said, as `Ok(())` or `Err(<lost reason>)`.
async fn fenced_write(app: &MySqlPool, value: &str) -> String {
    let mut transaction = app.begin().await.unwrap();
    let fenced = distlock::mysql::fence(&mut transaction).await;
    match fenced {
        Ok(()) => {
            sqlx::query("UPDATE resource SET value = ? WHERE id = 1")
                .bind(value)
                .execute(&mut *transaction)
                .await
                .unwrap();
            transaction.commit().await.unwrap();
        }
        Err(_) => transaction.rollback().await.unwrap(),
    }
    format!("{:?}", fenced.map_err(|e| e.lost_reason()))
}

fn resource_value(server: &MariaDbServer) -> String {
    server.sql("SELECT CONCAT(value, ' ', fence) FROM resource WHERE id = 1")
}

/// How many InnoDB transactions are open (the harness's own query aside).
fn open_transactions(server: &MariaDbServer) -> usize {
    server
        .sql(
            "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
             WHERE trx_mysql_thread_id <> CONNECTION_ID()",
        )
        .parse()
        .unwrap()
}

/// Live lock rows (holders and waiters) under the tests' prefix.
fn live_rows(server: &MariaDbServer) -> usize {
    server
        .sql(&format!(
            "SELECT COUNT(*) FROM {SCHEMA}.entries \
             WHERE lock_key LIKE '{PREFIX}:%' AND expires_at > UTC_TIMESTAMP(6)"
        ))
        .parse()
        .unwrap()
}

/// A lock user `name` (any host, no password) with no right at all, or with exactly the
/// GRANTs `distlock::mysql::grants` prints; answers its URL, which names no database.
fn lock_user(server: &MariaDbServer, name: &str, granted: bool) -> String {
    server.sql(&format!("CREATE USER '{name}'@'%'"));
    if granted {
        grant(server, name);
    }
    format!("mysql://{name}@127.0.0.1:{}", server.port())
}

/// Runs the GRANTs `distlock::mysql::grants` prints for `name`, as an operator would.
fn grant(server: &MariaDbServer, name: &str) {
    server.sql(&distlock::mysql::grants(SCHEMA, name).unwrap());
}

/// 3 processes × 4 tasks loop fenced sections on one key; every lock connection is ended
/// three times (`KILL CONNECTION`), then MariaDB crashes (SIGKILL) and is started again. Every
/// section completes, none overlaps, no token goes back across the crash (AUTO_INCREMENT
/// persists), the fence rejects nothing.
#[test]
fn connections_killed_and_the_server_restarted_under_load_never_overlap_or_go_back() {
    let mut server = Mysql::server();
    let resource = RedisServer::start();
    let mut workers: Vec<Worker> = (0..PROCESSES)
        .map(|index| {
            let env = sections::worker_env(&server.url(), &resource, index);
            Worker::spawn("worker_entry", "sections", &env)
        })
        .collect();
    let started = worker::start_together(&mut workers);
    sections::wait_for_tokens(&resource, 100);
    let first_100 = started.elapsed();

    let mut ended = 0;
    for _ in 0..3 {
        let at = sections::tokens_len(&resource);
        ended += server.kill_connections("root");
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
        "MYSQL faults under load: {PROCESSES} processes x {} tasks, {} sections, the first 100 \
         in {first_100:?}; {ended} lock connections killed in 3 rounds, then the server crashed \
         after {before_crash} sections (up again {restarted:?} later, 100 more sections \
         {resumed:?} after the crash, {} after it in all); {} overlaps, {regressions} token \
         regressions, {} fenced writes rejected, {} errors",
        sections::TASKS,
        total.sections,
        total.after_kill,
        total.overlaps,
        total.rejected,
        total.errors,
    );
    assert!(ended >= PROCESSES, "the lock connections were killed");
    assert_eq!(total.overlaps, 0, "critical sections overlapped");
    assert_eq!(regressions, 0, "fencing tokens went back");
    assert_eq!(total.rejected, 0, "a fenced write was rejected");
    assert_eq!(total.errors, 0, "a section did not complete");
    assert_eq!(tokens.len() as u64, total.sections);
}

/// Locks taken and released until the table is empty, then MariaDB crashes (SIGKILL) and is
/// started again: the next lock's token is still larger than every one before the crash. InnoDB
/// keeps the AUTO_INCREMENT counter across restarts (MariaDB 10.2.4+, MySQL 8.0+); an older
/// server would start it again at the largest token left in the table + 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_that_finds_the_table_empty_sends_no_token_back() {
    let mut server = Mysql::server();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let mut before = 0;
    for _ in 0..5 {
        let guard = Lock::new("counter").on(&backend).acquire().await.unwrap();
        before = guard.fencing_token();
        guard.release().await.unwrap();
    }
    let rows = server.sql(&format!("SELECT COUNT(*) FROM {SCHEMA}.entries"));
    assert_eq!(rows, "0", "a released lock left its row");
    server.kill();
    server.restart();
    let guard = Lock::new("counter")
        .on(&backend)
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .unwrap();
    let after = guard.fencing_token();
    guard.release().await.unwrap();
    eprintln!("MYSQL empty table crashed: the last token before {before}, the first after {after}");
    assert!(
        after > before,
        "token {after} after the crash, {before} before it"
    );
}

/// Takes the lock `held` with a 1 s watchdog lease, reports its token, and waits for the
/// parent (which stops and continues it meanwhile); then reports its checkpoint, what the
/// fence of its late write in its own transaction said, and how many rows its late write by
/// the recipe changed.
async fn hold() {
    let url = std::env::var("LOCK_URL").unwrap();
    let backend = backend(&url, HOLDER_LEASE);
    let app = MySqlPool::connect(&url).await.unwrap();
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
            worker::report("fence", fenced_write(&app, "late fenced write").await);
            worker::report("recipe", write_with_token(&app, token, "late write").await);
        })
        .await;
}

/// A holder stopped (SIGSTOP) while its watchdog keeps a 1 s lease: another process takes the
/// lock only after the holder's validity ended, with a larger token, and writes the table in
/// a fenced transaction and by the recipe; on SIGCONT the holder's checkpoint says the lease
/// expired, its fenced transaction is refused and commits nothing, and its late write by the
/// recipe changes nothing.
#[test]
fn a_paused_holder_wakes_up_lost_and_its_late_writes_are_refused() {
    let server = Mysql::server();
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
        let app = MySqlPool::connect(&server.url()).await.unwrap();
        let mut transaction = app.begin().await.unwrap();
        distlock::mysql::fence_guard(&guard, &mut transaction)
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
        "MYSQL pause: holder with a {HOLDER_LEASE:?} watchdog lease stopped; lock taken over \
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
    let app = MySqlPool::connect(&url).await.unwrap();
    let _ = Lock::new("held")
        .on(&backend)
        .run(async {
            let mut transaction = app.begin().await.unwrap();
            distlock::mysql::fence(&mut transaction).await.unwrap();
            let token = distlock::fencing_token().unwrap();
            worker::report("fenced", token);
            let order = tokio::task::spawn_blocking(worker::read_line)
                .await
                .unwrap();
            assert_eq!(order, "go");
            sqlx::query("UPDATE resource SET value = 'old holder', fence = ? WHERE id = 1")
                .bind(token)
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
    let server = Mysql::server();
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
        let expired = until_on_mysql(&server, Duration::from_secs(10), async || {
            server.sql(&format!(
                "SELECT COUNT(*) FROM {SCHEMA}.entries WHERE lock_key = '{lock}' \
                 AND token = {stale} AND expires_at > UTC_TIMESTAMP(6)"
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
        "MYSQL fenced transaction: holder (token {stale}) stopped inside it, its lease run out \
         in the database; not granted to the waiter in {:?} while it was open; granted {:?} \
         after the holder continued, with token {fresh}, finding `{value}`",
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
    let server = Mysql::server();
    let app = MySqlPool::connect(&server.url()).await.unwrap();
    let holder = backend(&server.url(), Duration::from_secs(30));
    let guard = Lock::new("taken").on(&holder).acquire().await.unwrap();
    let mut transaction = app.begin().await.unwrap();
    distlock::mysql::fence_guard(&guard, &mut transaction)
        .await
        .unwrap();
    transaction.commit().await.unwrap();

    let operator = backend(&server.url(), Duration::from_secs(30));
    assert!(operator.force_unlock("taken").await.unwrap().is_some());
    let other = Lock::new("taken").on(&operator).acquire().await.unwrap();
    assert!(guard.is_held(), "its own clock still says held");
    let mut transaction = app.begin().await.unwrap();
    let refused = distlock::mysql::fence_guard(&guard, &mut transaction).await;
    transaction.rollback().await.unwrap();
    eprintln!("MYSQL force-unlocked holder's fenced transaction: {refused:?}");
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
    distlock::mysql::fence_guard(&other, &mut transaction)
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
    let server = MariaDbServer::start();
    create_resource(&server);
    let app = MySqlPool::connect(&server.url()).await.unwrap();
    assert_eq!(write_with_token(&app, 7, "seven").await, 1);
    assert_eq!(write_with_token(&app, 7, "seven again").await, 1);
    assert_eq!(write_with_token(&app, 9, "nine").await, 1);
    assert_eq!(write_with_token(&app, 8, "eight, late").await, 0);
    assert_eq!(resource_value(&server), "nine 9");
}

/// Holds `clock-held`, then asks for `clock-wanted` (which the parent holds) and later is
/// granted it — all with a wall clock `FAKETIME` away from the database's.
async fn skewed() {
    let backend = backend(&std::env::var("LOCK_URL").unwrap(), KEPT_LEASE);
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
        .wait(KEPT_LEASE * 3)
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

/// A worker process whose wall clock is `offset` (libfaketime) off this one's, locking
/// through `url`; answers it with its clock's skew from ours, in seconds.
fn spawn_skewed(url: &str, offset: &str) -> (Worker, i64) {
    let skewed = Worker::spawn(
        "worker_entry",
        "skewed",
        &[
            ("LOCK_URL", url.to_owned()),
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
    (skewed, skew)
}

/// A process whose wall clock is three hours ahead, then one three hours behind, against this
/// one: it holds a lock through many renewals which nobody else is granted (three leases of
/// asking), and asks for one held here without being granted it (three leases), then is
/// granted it once released. Lease time is the database's; the holder's validity its
/// monotonic clock's.
#[test]
fn a_client_clock_hours_off_neither_steals_nor_loses_a_lock() {
    let server = Mysql::server();
    let runtime = worker::runtime();
    let here = backend(&server.url(), KEPT_LEASE);
    for offset in ["+3h", "-3h"] {
        let (mut skewed, skew) = spawn_skewed(&server.url(), offset);
        skewed.expect("acquired", Duration::from_secs(30));
        let stolen = runtime.block_on(
            Lock::new("clock-held")
                .on(&here)
                .wait(KEPT_LEASE * 3)
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
            "MYSQL clock {offset} ({skew} s): held through 3 leases, asked for here: {:?}; its \
             check {check}, release {release}; it asked for ours for 3 leases: {wanted}, ours \
             still {kept:?}; granted once released: {granted}",
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

/// The application's pool has one connection, and the body holds it throughout, in a fenced
/// transaction while a nested lock is taken, then while the watchdog renews the lease: the
/// lock's connections are distlock's own, so nothing waits for the body's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_one_connection_shared_by_the_body_and_the_lock_does_not_deadlock() {
    let server = Mysql::server();
    let pool = MySqlPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .unwrap();
    let backend = Backend::mysql(&pool)
        .prefix(PREFIX)
        .watchdog_lease(KEPT_LEASE)
        .build()
        .unwrap();
    let body = Lock::new("one").on(&backend).run(async {
        let mut connection = pool.acquire().await.unwrap();
        let mut transaction = Connection::begin(&mut *connection).await.unwrap();
        distlock::mysql::fence(&mut transaction).await.unwrap();
        Lock::new("two")
            .on(&backend)
            .run(async {
                distlock::mysql::fence(&mut transaction).await.unwrap();
                // Committed before the nested call returns: its release waits for the
                // transaction that locked its row.
                transaction.commit().await.unwrap();
            })
            .await
            .unwrap();
        let renewed = backend.stats().renewed;
        let renewed_again =
            distlock::__private::raw::until_local(Duration::from_secs(10), async || {
                backend.stats().renewed > renewed
            })
            .await;
        sqlx::query("SELECT 1")
            .execute(&mut *connection)
            .await
            .unwrap();
        renewed_again
    });
    let done = tokio::time::timeout(Duration::from_secs(20), body).await;
    eprintln!("MYSQL pool of one: renewed while the body held the pool's connection: {done:?}");
    assert!(
        matches!(done, Ok(Ok(true))),
        "the body and the lock deadlocked, or the lease was not renewed: {done:?}"
    );
}

/// 600 locked calls, each a fenced transaction that writes the table, cancelled at spread
/// points (waiting, holding, inside the fence, committing, releasing). Afterwards no lock row
/// is live (each cancelled holder's release runs on) and no transaction is left open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_fenced_writes_leave_no_row_held_and_no_transaction_open() {
    let server = Mysql::server();
    create_resource(&server);
    let app = MySqlPoolOptions::new()
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
                distlock::mysql::fence(&mut transaction).await.unwrap();
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
    // connection has been given back (rolled back, or closed) by then.
    let mut taken = Vec::new();
    for _ in 0..4 {
        let connection = tokio::time::timeout(Duration::from_secs(10), app.acquire()).await;
        let connection = connection.unwrap_or_else(|_| {
            panic!(
                "a connection of the application's pool never came back in 10 s ({} open, {} \
                 idle, {} taken here): a cancelled call left it waiting for a reply",
                app.size(),
                app.num_idle(),
                taken.len()
            )
        });
        taken.push(connection.unwrap());
    }
    let open = open_transactions(&server);
    drop(taken);
    let released = until_on_mysql(&server, Duration::from_secs(10), async || {
        live_rows(&server) == 0
    })
    .await;
    eprintln!(
        "MYSQL cancelled fenced writes: 600 calls, {completed} completed, the rest cancelled; \
         {open} transactions left open; every lock row gone: {released}"
    );
    assert!(completed > 0 && completed < 600, "the cancel points spread");
    assert_eq!(open, 0, "a cancelled fenced transaction was left open");
    assert!(released, "a cancelled call left its lock row held");
}

/// A database without the schema: `ping` names what to run; with `create_schema` the backend
/// creates it at first use and locks work. The doctor names the harness's
/// `innodb_flush_log_at_trx_commit = 2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_schema_is_named_and_created_only_when_asked() {
    let server = MariaDbServer::start();
    let plain = Backend::builder(server.url())
        .schema("app_locks")
        .build()
        .unwrap();
    let err = plain.ping().await.unwrap_err().to_string();
    assert!(
        err.contains("no distlock schema `app_locks`")
            && err.contains("distlock schema mysql --schema app_locks"),
        "{err}"
    );
    assert_eq!(
        server.sql(
            "SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = 'app_locks'"
        ),
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
    eprintln!("MYSQL missing schema: {err}; doctor: {findings:?}");
    assert!(
        findings.iter().any(|f| f.check == Check::Persistence
            && f.advice.contains("innodb_flush_log_at_trx_commit is 2")),
        "{findings:?}"
    );
}

/// One connection of the application, killed while it is in a fenced transaction: the
/// transaction is gone with it (nothing committed), and the lock is still held and released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_whose_connection_drops_commits_nothing() {
    let server = Mysql::server();
    create_resource(&server);
    let backend = backend(&server.url(), Duration::from_secs(5));
    let mut connection = MySqlConnection::connect(&server.url()).await.unwrap();
    let guard = Lock::new("dropped").on(&backend).acquire().await.unwrap();
    let mut transaction = connection.begin().await.unwrap();
    distlock::mysql::fence_guard(&guard, &mut transaction)
        .await
        .unwrap();
    sqlx::query("UPDATE resource SET value = 'uncommitted' WHERE id = 1")
        .execute(&mut *transaction)
        .await
        .unwrap();
    let id: u64 = sqlx::query_scalar("SELECT CONNECTION_ID()")
        .fetch_one(&mut *transaction)
        .await
        .unwrap();
    server.sql(&format!("KILL CONNECTION {id}"));
    let commit = transaction.commit().await;
    eprintln!("MYSQL killed fenced transaction's commit: {commit:?}");
    assert!(commit.is_err());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert_eq!(resource_value(&server), "none 0");
}

/// Takes `key` on `backend`, reads it back with `inspect` (the holder's token) and from the
/// table (the row's `lock_key`, byte for byte), and releases it: free again.
async fn lock_and_read_back(server: &MariaDbServer, backend: &Backend, key: &str) {
    let guard = Lock::new(key).on(backend).acquire().await.unwrap();
    let holder = backend.inspect(key).await.unwrap().expect("held");
    assert_eq!(holder.fencing_token, guard.fencing_token(), "{key}");
    let stored = server.sql(&format!(
        "SELECT HEX(lock_key) FROM {SCHEMA}.entries WHERE token = {}",
        guard.fencing_token()
    ));
    let name = format!("{PREFIX}:{{{key}}}");
    let hex: String = name.bytes().map(|b| format!("{b:02X}")).collect();
    assert_eq!(stored, hex, "the row of {key:?} holds another name");
    guard.release().await.unwrap();
    assert!(backend.inspect(key).await.unwrap().is_none(), "{key}");
}

/// Keys of 512 bytes (the default limit; ASCII and Cyrillic) and non-ASCII keys are taken,
/// inspected and released, stored byte for byte; keys that differ only in case, in accents'
/// case or in a trailing space are different locks (the columns are VARBINARY, with no
/// collation); a lock name of exactly 2048 bytes works and one byte more is refused, naming the
/// lock table's column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_512_bytes_and_non_ascii_keys_work() {
    let server = Mysql::server();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let ascii = "k".repeat(512);
    let cyrillic = "ж".repeat(256);
    for key in [&ascii, &cyrillic, "заказ:42", "注文:7", "order:ÄÖ"] {
        lock_and_read_back(&server, &backend, key).await;
    }
    for (one, other) in [
        ("Order:1", "order:1"),
        ("order:ÄÖ", "order:äö"),
        ("order:1", "order:1 "),
    ] {
        let first = Lock::new(one).on(&backend).acquire().await.unwrap();
        let second = Lock::new(other).on(&backend).acquire().await;
        let second = second.unwrap_or_else(|e| panic!("{other:?} after {one:?}: {e}"));
        let seen = backend.inspect(one).await.unwrap().unwrap().fencing_token;
        assert_eq!(seen, first.fencing_token(), "{one:?} is read as {other:?}");
        first.release().await.unwrap();
        second.release().await.unwrap();
    }
    let long = Backend::builder(server.url())
        .prefix(PREFIX)
        .max_key_len(4096)
        .build()
        .unwrap();
    let fits = "x".repeat(MAX_LOCK_NAME - format!("{PREFIX}:{{}}").len());
    lock_and_read_back(&server, &long, &fits).await;
    let over = format!("{fits}x");
    let refused = Lock::new(over.as_str()).on(&long).acquire().await;
    let refused = refused.map(|_| ()).unwrap_err().to_string();
    let inspected = long.inspect(&over).await.unwrap_err().to_string();
    eprintln!(
        "MYSQL keys: 512-byte, non-ASCII and case-distinct keys locked; a {}-byte lock name \
         locked; one byte more: {refused}",
        MAX_LOCK_NAME
    );
    for err in [&refused, &inspected] {
        assert!(err.contains("over the 2048 bytes"), "{err}");
    }
    assert_eq!(live_rows(&server), 0);
}

/// The session time zone `url`'s connections set (sqlx's `time-zone` parameter), as
/// `SELECT @@time_zone` answers it.
async fn session_time_zone(url: &str) -> String {
    let mut connection = MySqlConnection::connect(url).await.unwrap();
    sqlx::query_scalar("SELECT @@session.time_zone")
        .fetch_one(&mut connection)
        .await
        .unwrap()
}

/// A backend whose sessions are at UTC+9 and one whose sessions are at UTC−8 contend on one
/// key, each order in turn: the lease rows are in UTC, so the time left each reads (and the
/// row itself, on UTC_TIMESTAMP) stays within the lease, and the other waits, told it is
/// busy, and is granted the lock once the first releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_time_zone_changes_nothing() {
    let server = Mysql::server();
    let lease = Duration::from_secs(5);
    let zones = [("%2B09:00", "+09:00"), ("-08:00", "-08:00")];
    for (first, second) in [(zones[0], zones[1]), (zones[1], zones[0])] {
        let first_url = format!("{}?time-zone={}", server.url(), first.0);
        let second_url = format!("{}?time-zone={}", server.url(), second.0);
        assert_eq!(session_time_zone(&first_url).await, first.1);
        assert_eq!(session_time_zone(&second_url).await, second.1);
        let holder = backend(&first_url, lease);
        let waiter = backend(&second_url, lease);
        let guard = Lock::new("zoned").on(&holder).acquire().await.unwrap();
        let theirs = waiter.inspect("zoned").await.unwrap().expect("held").ttl;
        let ours = holder.inspect("zoned").await.unwrap().expect("held").ttl;
        let row_ms: i64 = server
            .sql(&format!(
                "SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) DIV 1000 \
                 FROM {SCHEMA}.entries WHERE lock_key = '{PREFIX}:{{zoned}}'"
            ))
            .parse()
            .unwrap();
        let busy = waiter.stats().busy_replies;
        let mut wanted = tokio::spawn({
            let waiter = waiter.clone();
            async move {
                let guard = Lock::new("zoned")
                    .on(&waiter)
                    .wait(Duration::from_secs(30))
                    .acquire()
                    .await;
                guard.map(|guard| (guard, Instant::now()))
            }
        });
        let told_busy = distlock::__private::raw::until_local(lease, async || {
            waiter.stats().busy_replies > busy
        })
        .await;
        assert!(told_busy, "the waiter was never told the lock is busy");
        assert!(
            !wanted.is_finished(),
            "granted while the first held the lock"
        );
        let released_at = Instant::now();
        let stale = guard.fencing_token();
        guard.release().await.unwrap();
        let (granted, granted_at) = (&mut wanted).await.unwrap().unwrap();
        eprintln!(
            "MYSQL time zones: held at {}, time left read at {}: {theirs:?}, at {}: {ours:?}, \
             on the row: {row_ms} ms; the other waited, granted {:?} after the release",
            first.1,
            second.1,
            first.1,
            granted_at - released_at
        );
        // Hours off, a row would read as expired (no holder) or as living for hours.
        for ttl in [theirs, ours, Duration::from_millis(row_ms.max(0) as u64)] {
            assert!(
                ttl <= lease && !ttl.is_zero(),
                "{ttl:?} left of a {lease:?} lease"
            );
        }
        assert!(granted.fencing_token() > stale);
        granted.release().await.unwrap();
    }
}

/// A server started `--read-only`, with a lock user that has only the lock GRANTs (no
/// SUPER, which would pass over read-only): the doctor says it is a standby, and a lock is
/// refused, naming read-only and the primary as the place to point at.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_server_is_named_by_the_doctor_and_refuses_locks() {
    let server = MariaDbServer::start_with(&["--read-only"]);
    server.sql(&distlock::mysql::schema(SCHEMA).unwrap());
    let url = lock_user(&server, "locker", true);
    let backend = backend(&url, Duration::from_secs(5));
    let findings = backend.doctor().await.unwrap();
    // Granted, the body answers the lock rows the read-only server holds meanwhile.
    let result = Lock::new("on-read-only")
        .on(&backend)
        .wait(Duration::ZERO)
        .run(async { server.sql(&format!("SELECT COUNT(*) FROM {SCHEMA}.entries")) })
        .await;
    eprintln!("MYSQL read-only: doctor {findings:?}; lock {result:?}");
    assert!(
        findings.iter().any(|f| f.check == Check::Standby),
        "{findings:?}"
    );
    let err = result
        .expect_err("a lock row written on a read-only server")
        .to_string();
    assert!(
        err.contains("read-only") && err.contains("point the backend at the primary"),
        "{err}"
    );
}

/// A lock user with no right on the lock database: `ping` and a lock fail, naming `distlock
/// acl mysql`; once granted exactly what `distlock::mysql::grants` prints (and nothing more)
/// the user pings, locks, inspects and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_the_grants_is_told_what_to_grant() {
    let server = Mysql::server();
    let url = lock_user(&server, "locker", false);
    let backend = backend(&url, Duration::from_secs(5));
    let pinged = backend.ping().await.unwrap_err().to_string();
    let locked = Lock::new("granted")
        .on(&backend)
        .wait(Duration::ZERO)
        .run(async {})
        .await
        .unwrap_err()
        .to_string();
    for err in [&pinged, &locked] {
        assert!(err.contains("distlock acl mysql"), "{err}");
    }
    grant(&server, "locker");
    let grants = server.sql("SHOW GRANTS FOR 'locker'@'%'");
    backend.ping().await.unwrap();
    let guard = Lock::new("granted").on(&backend).acquire().await.unwrap();
    let holder = backend.inspect("granted").await.unwrap().expect("held");
    assert_eq!(holder.fencing_token, guard.fencing_token());
    guard.release().await.unwrap();
    eprintln!("MYSQL no grants: ping said `{pinged}`; granted:\n{grants}");
    let mut lines: Vec<&str> = grants.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "GRANT EXECUTE ON `distlock`.* TO `locker`@`%`",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `distlock`.`entries` TO `locker`@`%`",
            "GRANT SELECT, INSERT, UPDATE, DELETE ON `distlock`.`locks` TO `locker`@`%`",
            "GRANT USAGE ON *.* TO `locker`@`%`",
        ],
        "the lock user has more than the lock grants"
    );
}
