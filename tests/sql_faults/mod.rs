//! The PostgreSQL and MySQL engines under faults and inside the application's own transactions,
//! written once: each test body and worker role here runs on either [`Database`], and
//! tests/postgres.rs and tests/mysql.rs run every test here on theirs ([`tests_on`]), under the
//! body's name. The lock connections ended and the server crashed under load from several
//! processes, a holder paused past its lease, a holder paused inside its fenced transaction, a
//! fenced transaction refused once the lock row is gone, a client whose wall clock is hours off,
//! a pool of one connection, cancelled fenced writes, a missing schema, a fenced transaction
//! whose connection drops.
//! A separate Redis (the resource) records the sections of the multi-process tests and fences
//! their writes; the application's own table `resource` records the fenced writes in the
//! database. The application's statements but the recipe's write their values in: the values
//! are the tests' own.
//!
//! Figures are printed on stderr as lines that begin with the database's name
//! ([`Database::FIGURES`]).

use crate::common::database::{Connection, Database, SCHEMA};
use crate::common::sections::{self, Tally};
use crate::common::worker::{self, Worker};
use crate::common::PREFIX;
use distlock::{Backend, Check, Lock, LockError, LockGuard, LostReason};
use distlock_test_support::RedisServer;
use sqlx::pool::PoolOptions;
use sqlx::Connection as _;
use sqlx::Pool;
use std::time::{Duration, Instant};

/// The worker processes of the multi-process tests.
pub const PROCESSES: usize = 3;
/// The paused holders' watchdog lease.
pub const HOLDER_LEASE: Duration = Duration::from_secs(1);
/// The watchdog lease of holders that must keep their lock through renewals on a busy machine:
/// a 1 s lease was lost to a 650 ms stall, and a 2 s one in CI, beside the other tests.
pub const KEPT_LEASE: Duration = Duration::from_secs(4);

/// A backend on `url` with the tests' prefix and a watchdog lease of `lease`.
pub fn backend(url: &str, lease: Duration) -> Backend {
    Backend::builder(url)
        .prefix(PREFIX)
        .watchdog_lease(lease)
        .build()
        .unwrap()
}

/// The error of a lock on `key` that `backend` must refuse at once, as text.
pub async fn refused(backend: &Backend, key: &str) -> String {
    let locked = Lock::new(key)
        .on(backend)
        .wait(Duration::ZERO)
        .run(async {});
    locked.await.unwrap_err().to_string()
}

/// Plays the worker `role` the tests here spawn, on `D`.
pub async fn play<D: Database>(role: &str) {
    match role {
        "sections" => sections::run().await,
        "hold" => hold::<D>().await,
        "hold_in_transaction" => hold_in_transaction::<D>().await,
        "skewed" => skewed().await,
        other => panic!("unknown worker role {other}"),
    }
}

/// The tests here as `#[test]`s of the target that calls it, on the database `$db`, each under
/// its body's name; the crash under load under `$crash` (how the database ends connections and
/// crashes differs, and the name says so).
macro_rules! tests_on {
    ($db:ty, $crash:ident) => {
        #[test]
        fn $crash() {
            $crate::sql_faults::connections_ended_and_the_server_crashed_under_load::<$db>();
        }
        $crate::sql_faults::tests_on!(@blocking $db:
            a_paused_holder_wakes_up_lost_and_its_late_writes_are_refused,
            a_takeover_waits_for_the_holders_fenced_transaction,
            a_client_clock_hours_off_neither_steals_nor_loses_a_lock,
        );
        $crate::sql_faults::tests_on!(@async $db:
            a_fenced_transaction_is_refused_once_the_lock_row_is_gone,
            the_recipe_applies_a_write_only_while_no_newer_token_wrote,
            a_pool_of_one_connection_shared_by_the_body_and_the_lock_does_not_deadlock,
            cancelled_fenced_writes_leave_no_row_held_and_no_transaction_open,
            a_missing_schema_is_named_and_created_only_when_asked,
            a_fenced_transaction_whose_connection_drops_commits_nothing,
        );
    };
    (@blocking $db:ty: $($test:ident,)*) => {$(
        #[test]
        fn $test() {
            $crate::sql_faults::$test::<$db>();
        }
    )*};
    (@async $db:ty: $($test:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            $crate::sql_faults::$test::<$db>().await;
        }
    )*};
}
pub(crate) use tests_on;

/// The statement that sets the application's row to `value`.
fn set_value(value: &str) -> String {
    format!("UPDATE resource SET value = '{value}' WHERE id = 1")
}

/// A transaction of the application's own, fenced as the guide says (for the locks of `guard`,
/// or else of the call it runs in): `value` written and the transaction committed when the fence
/// lets it through, rolled back when it refuses. Answers what the fence said.
async fn fenced_write<D: Database>(
    app: &Pool<D::Sqlx>,
    guard: Option<&LockGuard>,
    value: Option<&str>,
) -> Result<(), LockError> {
    let mut transaction = app.begin().await.unwrap();
    let fenced = match guard {
        Some(guard) => D::fence_guard(guard, &mut transaction).await,
        None => D::fence(&mut transaction).await,
    };
    if fenced.is_err() {
        transaction.rollback().await.unwrap();
        return fenced;
    }
    if let Some(value) = value {
        D::execute(&mut transaction, set_value(value)).await;
    }
    transaction.commit().await.unwrap();
    fenced
}

/// 3 processes × 4 tasks loop fenced sections on one key; every lock connection is ended three
/// times (`pg_terminate_backend`, `KILL CONNECTION`), then the server crashes and is started
/// again. Every section completes, none overlaps, no token goes back across the crash (neither
/// a sequence nor AUTO_INCREMENT does), the fence rejects nothing.
pub fn connections_ended_and_the_server_crashed_under_load<D: Database>() {
    let mut server = D::with_schema();
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
        ended += server.end_lock_connections();
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
        "{} faults under load: {PROCESSES} processes x {} tasks, {} sections, the first 100 in \
         {first_100:?}; {ended} lock connections ended in 3 rounds, then the server crashed \
         after {before_crash} sections (up again {restarted:?} later, 100 more sections \
         {resumed:?} after the crash, {} after it in all); {} overlaps, {regressions} token \
         regressions, {} fenced writes rejected, {} errors",
        D::FIGURES,
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

/// Runs `body` as a worker holding the lock `held` (a 1 s watchdog lease) on `LOCK_URL`, with
/// the application's pool on the same database.
async fn holding<D: Database>(body: impl AsyncFnOnce(&Pool<D::Sqlx>)) {
    let url = std::env::var("LOCK_URL").unwrap();
    let backend = backend(&url, HOLDER_LEASE);
    let app = Pool::<D::Sqlx>::connect(&url).await.unwrap();
    let _ = Lock::new("held").on(&backend).run(body(&app)).await;
}

/// Takes the lock `held` with a 1 s watchdog lease, reports its token, and waits for the
/// parent (which stops and continues it meanwhile); then reports its checkpoint, what the
/// fence of its late write in its own transaction said, and how many rows its late write by
/// the recipe changed.
async fn hold<D: Database>() {
    holding::<D>(async |app| {
        let token = distlock::fencing_token().unwrap();
        worker::report("acquired", token);
        worker::checkpoint_on_go().await;
        let fenced = fenced_write::<D>(app, None, Some("late fenced write")).await;
        let fenced = fenced.map_err(|e| e.lost_reason());
        worker::report("fence", format!("{fenced:?}"));
        let recipe = D::write_with_token(app, token, "late write").await;
        worker::report("recipe", recipe);
    })
    .await;
}

/// A worker playing `role` on `server`, stopped (SIGSTOP) once it reported `event` with the
/// token it holds; answers it and that token.
fn stopped_holder<D: Database>(server: &D, role: &str, event: &str) -> (Worker, u64) {
    let holder = Worker::spawn("worker_entry", role, &[("LOCK_URL", server.url())]);
    let token = holder
        .expect(event, Duration::from_secs(30))
        .parse()
        .unwrap();
    holder.signal(libc::SIGSTOP);
    (holder, token)
}

/// A holder stopped (SIGSTOP) while its watchdog keeps a 1 s lease: another process takes the
/// lock only after the holder's validity ended, with a larger token, and writes the table in
/// a fenced transaction and by the recipe; on SIGCONT the holder's checkpoint says the lease
/// expired, its fenced transaction is refused and commits nothing, and its late write by the
/// recipe changes nothing.
pub fn a_paused_holder_wakes_up_lost_and_its_late_writes_are_refused<D: Database>() {
    let server = D::with_schema();
    server.create_resource();
    let (mut holder, stale) = stopped_holder(&server, "hold", "acquired");
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
        let app = Pool::<D::Sqlx>::connect(&server.url()).await.unwrap();
        let fenced = fenced_write::<D>(&app, Some(&guard), Some("new holder, fenced")).await;
        fenced.unwrap();
        let token = guard.fencing_token();
        assert_eq!(D::write_with_token(&app, token, "new holder").await, 1);
        guard.release().await.unwrap();
        (token, taken_after)
    });
    holder.signal(libc::SIGCONT);
    holder.send("go");
    let checkpoint = holder.expect("checkpoint", Duration::from_secs(30));
    let fence = holder.expect("fence", Duration::from_secs(30));
    let recipe = holder.expect("recipe", Duration::from_secs(30));
    assert!(holder.wait().success());
    let value = server.resource_value();
    eprintln!(
        "{} pause: holder with a {HOLDER_LEASE:?} watchdog lease stopped; lock taken over after \
         {taken_after:?} with token {fresh} (the holder's {stale}); on SIGCONT its checkpoint \
         said `{checkpoint}`, its fenced transaction `{fence}`, its late write by the recipe \
         changed {recipe} rows; the table holds `{value}`",
        D::FIGURES
    );
    assert!(fresh > stale, "the new holder's token is larger");
    worker::assert_not_taken_within_validity(taken_after, HOLDER_LEASE);
    assert_eq!(checkpoint, "lost Some(Expired)");
    assert_eq!(fence, "Err(Some(Expired))");
    assert_eq!(recipe, "0");
    assert_eq!(value, format!("new holder {fresh}"));
}

/// Takes the lock `held` with a 1 s watchdog lease, opens a transaction and fences it, reports
/// `fenced` with its token, waits for the parent's `go` (stopped and continued meanwhile),
/// then writes the table in that transaction and commits it.
async fn hold_in_transaction<D: Database>() {
    holding::<D>(async |app| {
        let mut transaction = app.begin().await.unwrap();
        D::fence(&mut transaction).await.unwrap();
        let token = distlock::fencing_token().unwrap();
        worker::report("fenced", token);
        assert_eq!(worker::order().await, "go");
        let write =
            format!("UPDATE resource SET value = 'old holder', fence = {token} WHERE id = 1");
        D::execute(&mut transaction, write).await;
        transaction.commit().await.unwrap();
        worker::report("committed", "");
    })
    .await;
}

/// A holder stopped inside its fenced transaction: its lease runs out in the database, yet
/// nobody is granted the lock while the transaction is open (three leases); continued, it
/// commits, and only then the waiting process is granted the lock, and finds the old holder's
/// write committed. The takeover waited for the transaction.
pub fn a_takeover_waits_for_the_holders_fenced_transaction<D: Database>() {
    let server = D::with_schema();
    server.create_resource();
    let (mut holder, stale) = stopped_holder(&server, "hold_in_transaction", "fenced");

    let runtime = worker::runtime();
    let taker = backend(&server.url(), Duration::from_secs(5));
    let mut acquire = runtime.spawn(async move {
        let guard = Lock::new("held")
            .on(&taker)
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        (guard, Instant::now())
    });
    let held_while_open = runtime.block_on(async {
        lease_runs_out_in_the_database(&server, stale).await;
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
    let value = server.resource_value();
    let fresh = guard.fencing_token();
    runtime.block_on(guard.release()).unwrap();
    assert!(holder.wait().success());
    eprintln!(
        "{} fenced transaction: holder (token {stale}) stopped inside it, its lease run out in \
         the database; not granted to the waiter in {:?} while it was open; granted {:?} after \
         the holder continued, with token {fresh}, finding `{value}`",
        D::FIGURES,
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

/// Waits (at most 10 s) until the lease of the holder of `held` with token `stale` has run out
/// in the database: its row is no longer live.
async fn lease_runs_out_in_the_database<D: Database>(server: &D, stale: u64) {
    let live_row = format!(
        "SELECT COUNT(*) FROM {SCHEMA}.entries WHERE {} = '{PREFIX}:{{held}}' \
         AND token = {stale} AND expires_at > {}",
        D::KEY_COLUMN,
        D::NOW
    );
    let expired = server
        .until(Duration::from_secs(10), async || {
            server.sql(&live_row) == "0"
        })
        .await;
    assert!(
        expired,
        "the stopped holder's lease ran out in the database"
    );
}

/// The lock row deleted behind the holder's back (an operator's force-unlock, then another
/// holder): the holder's own clock still says it holds the lock, but the database refuses its
/// fenced transaction, naming the lock gone.
pub async fn a_fenced_transaction_is_refused_once_the_lock_row_is_gone<D: Database>() {
    let server = D::with_schema();
    let app = Pool::<D::Sqlx>::connect(&server.url()).await.unwrap();
    let holder = backend(&server.url(), Duration::from_secs(30));
    let guard = Lock::new("taken").on(&holder).acquire().await.unwrap();
    fenced_write::<D>(&app, Some(&guard), None).await.unwrap();

    let operator = backend(&server.url(), Duration::from_secs(30));
    assert!(operator.force_unlock("taken").await.unwrap().is_some());
    let other = Lock::new("taken").on(&operator).acquire().await.unwrap();
    assert!(guard.is_held(), "its own clock still says held");
    let refused = fenced_write::<D>(&app, Some(&guard), None).await;
    eprintln!(
        "{} force-unlocked holder's fenced transaction: {refused:?}",
        D::FIGURES
    );
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
    fenced_write::<D>(&app, Some(&other), None).await.unwrap();
    other.release().await.unwrap();
    let _ = guard.release().await;
}

/// The recipe's rule, on its own: a write names its token and applies only while no newer
/// token wrote the row; the same holder may write again.
pub async fn the_recipe_applies_a_write_only_while_no_newer_token_wrote<D: Database>() {
    let server = D::start();
    server.create_resource();
    let app = Pool::<D::Sqlx>::connect(&server.url()).await.unwrap();
    assert_eq!(D::write_with_token(&app, 7, "seven").await, 1);
    assert_eq!(D::write_with_token(&app, 7, "seven again").await, 1);
    assert_eq!(D::write_with_token(&app, 9, "nine").await, 1);
    assert_eq!(D::write_with_token(&app, 8, "eight, late").await, 0);
    assert_eq!(server.resource_value(), "nine 9");
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
    assert_eq!(worker::order().await, "release");
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
    assert_eq!(worker::order().await, "go");
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
pub fn a_client_clock_hours_off_neither_steals_nor_loses_a_lock<D: Database>() {
    let server = D::with_schema();
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
            "{} clock {offset} ({skew} s): held through 3 leases, asked for here: {:?}; its \
             check {check}, release {release}; it asked for ours for 3 leases: {wanted}, ours \
             still {kept:?}; granted once released: {granted}",
            D::FIGURES,
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

/// The application's pool has one connection, and the body holds it throughout: in a fenced
/// transaction while a nested lock is taken (and released), then while the watchdog renews the
/// lease, the transaction still open where the release does not wait for it (PostgreSQL). The
/// lock's connections are distlock's own, so nothing waits for the body's.
pub async fn a_pool_of_one_connection_shared_by_the_body_and_the_lock_does_not_deadlock<
    D: Database,
>() {
    let server = D::with_schema();
    let pool = PoolOptions::<D::Sqlx>::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .unwrap();
    let backend = D::backend_on(&pool)
        .prefix(PREFIX)
        .watchdog_lease(KEPT_LEASE)
        .build()
        .unwrap();
    let body = Lock::new("one").on(&backend).run(async {
        let mut connection = pool.acquire().await.unwrap();
        let mut transaction = Some(connection.begin().await.unwrap());
        D::fence(transaction.as_mut().unwrap()).await.unwrap();
        Lock::new("two")
            .on(&backend)
            .run(async {
                D::fence(transaction.as_mut().unwrap()).await.unwrap();
                if D::RELEASE_WAITS_FOR_FENCE {
                    // Committed before the nested call returns: its release waits for the
                    // transaction that locked its row.
                    transaction.take().unwrap().commit().await.unwrap();
                }
            })
            .await
            .unwrap();
        let renewed = backend.stats().renewed;
        let renewed_again =
            distlock::__private::raw::until_local(Duration::from_secs(10), async || {
                backend.stats().renewed > renewed
            })
            .await;
        // The connection answers still: in the transaction where it is open, and after it.
        if let Some(mut open) = transaction.take() {
            D::execute(&mut open, "SELECT 1".to_owned()).await;
            open.commit().await.unwrap();
        }
        drop(transaction);
        D::execute(&mut connection, "SELECT 1".to_owned()).await;
        renewed_again
    });
    let done = tokio::time::timeout(Duration::from_secs(20), body).await;
    eprintln!(
        "{} pool of one: renewed while the body held the pool's connection: {done:?}",
        D::FIGURES
    );
    assert!(
        matches!(done, Ok(Ok(true))),
        "the body and the lock deadlocked, or the lease was not renewed: {done:?}"
    );
}

/// 600 locked calls, each a fenced transaction that writes the table, cancelled at spread
/// points (waiting, holding, inside the fence, committing, releasing). Afterwards no lock row
/// is live (each cancelled holder's release runs on) and no transaction is left open.
pub async fn cancelled_fenced_writes_leave_no_row_held_and_no_transaction_open<D: Database>() {
    let server = D::with_schema();
    server.create_resource();
    let app = PoolOptions::<D::Sqlx>::new()
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
                let written = fenced_write::<D>(&app, None, Some("written")).await;
                written.unwrap();
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
    let open = server.open_transactions();
    drop(taken);
    let released = server
        .until(Duration::from_secs(10), async || server.live_rows() == 0)
        .await;
    eprintln!(
        "{} cancelled fenced writes: 600 calls, {completed} completed, the rest cancelled; \
         {open} transactions left open; every lock row gone: {released}",
        D::FIGURES
    );
    assert!(completed > 0 && completed < 600, "the cancel points spread");
    assert_eq!(open, 0, "a cancelled fenced transaction was left open");
    assert!(released, "a cancelled call left its lock row held");
}

/// A database without the schema: `ping` names what to run; with `create_schema` the backend
/// creates it at first use and locks work. The doctor names the harness's relaxed durability
/// (PostgreSQL's `fsync = off`, MySQL's `innodb_flush_log_at_trx_commit = 2`).
pub async fn a_missing_schema_is_named_and_created_only_when_asked<D: Database>() {
    let server = D::start();
    let plain = Backend::builder(server.url())
        .schema("app_locks")
        .build()
        .unwrap();
    let err = plain.ping().await.unwrap_err().to_string();
    let command = format!("distlock schema {} --schema app_locks", D::KIND);
    assert!(
        err.contains("no distlock schema `app_locks`") && err.contains(&command),
        "{err}"
    );
    assert_eq!(
        server.sql(
            "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = 'app_locks'"
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
    eprintln!("{} missing schema: {err}; doctor: {findings:?}", D::FIGURES);
    assert!(
        findings
            .iter()
            .any(|f| f.check == Check::Persistence && f.advice.contains(D::RELAXED_DURABILITY)),
        "{findings:?}"
    );
}

/// One connection of the application, ended while it is in a fenced transaction: the
/// transaction is gone with it (nothing committed), and the lock is still held and released.
pub async fn a_fenced_transaction_whose_connection_drops_commits_nothing<D: Database>() {
    let server = D::with_schema();
    server.create_resource();
    let backend = backend(&server.url(), Duration::from_secs(5));
    let mut connection = Connection::<D>::connect(&server.url()).await.unwrap();
    let guard = Lock::new("dropped").on(&backend).acquire().await.unwrap();
    let mut transaction = connection.begin().await.unwrap();
    D::fence_guard(&guard, &mut transaction).await.unwrap();
    D::execute(&mut transaction, set_value("uncommitted")).await;
    let id = D::session_id(&mut transaction).await;
    server.end_session(id);
    let commit = transaction.commit().await;
    eprintln!(
        "{} ended fenced transaction's commit: {commit:?}",
        D::FIGURES
    );
    assert!(commit.is_err());
    assert!(guard.is_held());
    guard.release().await.unwrap();
    assert_eq!(server.resource_value(), "none 0");
}
