//! The MySQL engine on MariaDB under faults and inside the application's own transactions, on
//! servers the harness starts per test: the tests written once for PostgreSQL and MySQL
//! (`sql_faults`), called here on MariaDB under their names, and those of MySQL's own: a crash
//! with an empty lock table, long and non-ASCII keys, sessions in other time zones, a read-only
//! server, a lock user without its grants.
//!
//! Figures are printed as `MYSQL …` lines on stderr.

mod common;
mod sql_faults;

use common::database::Database;
use common::mysql::SCHEMA;
use common::worker;
use common::{Mysql, PREFIX};
use distlock::{Backend, Check, Lock};
use distlock_test_support::MariaDbServer;
use sql_faults::backend;
use sqlx::{Connection, MySqlConnection};
use std::time::{Duration, Instant};

/// The longest lock name the lock table's `lock_key` column holds, in bytes.
const MAX_LOCK_NAME: usize = 2048;

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = worker::role() else { return };
    worker::runtime().block_on(sql_faults::play::<MariaDbServer>(&role));
}

// The tests written once for PostgreSQL and MySQL, on MariaDB: its lock connections ended by
// `KILL CONNECTION`, its crash a SIGKILL (AUTO_INCREMENT persists).
sql_faults::tests_on!(
    MariaDbServer,
    connections_killed_and_the_server_restarted_under_load_never_overlap_or_go_back
);

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
    assert_eq!(server.live_rows(), 0);
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
    let locked = sql_faults::refused(&backend, "granted").await;
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

/// Transactions waiting for a row lock now (`Innodb_row_lock_current_waits`).
fn row_lock_waits(server: &MariaDbServer) -> u64 {
    global_status(server, "INNODB_ROW_LOCK_CURRENT_WAITS")
}

/// The InnoDB deadlocks the server has detected since it started.
fn deadlocks(server: &MariaDbServer) -> u64 {
    global_status(server, "INNODB_DEADLOCKS")
}

/// The server's status variable `name`, read live.
fn global_status(server: &MariaDbServer, name: &str) -> u64 {
    server
        .sql(&format!(
            "SELECT VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS \
             WHERE VARIABLE_NAME = '{name}'"
        ))
        .parse()
        .unwrap()
}

/// Waits (at most 10 s) until a transaction waits for a row lock; whether one did. No event
/// tells it: each round asks the server once more. The counter is live; `INNODB_TRX` is not:
/// InnoDB refills that table's snapshot only once it has gone unread for 100 ms (`trx0i_s.cc`,
/// `CACHE_MIN_IDLE_TIME_NS`), so asking it in a loop keeps showing the first answer.
fn until_a_lock_wait(server: &MariaDbServer) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while row_lock_waits(server) == 0 {
        if Instant::now() >= deadline {
            return false;
        }
    }
    true
}

/// A join that deadlocks with the application's transaction is sent again, with the same owner,
/// and the lock is granted; nothing reports a lost lock. The join holds the key's row and waits
/// for an expired entry the application has locked; the application, which has written more,
/// then asks for the key's row, and InnoDB rolls the join back (1213) as the smaller of the two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_join_that_deadlocks_is_sent_again_and_the_lock_is_granted() {
    let server = Mysql::server();
    let lock = format!("{PREFIX}:{{deadlocked}}");
    server.sql(&format!(
        "CREATE TABLE test.scratch (n INT PRIMARY KEY) ENGINE = InnoDB; \
         INSERT INTO {SCHEMA}.entries (lock_key, owner, kind, label, expires_at) \
         VALUES ('{lock}', 'gone', 'W', 'gone', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)"
    ));
    let before = deadlocks(&server);
    let mut app = MySqlConnection::connect(&server.url()).await.unwrap();
    for statement in [
        "BEGIN".to_owned(),
        // More rows written than a join writes: InnoDB rolls the smaller transaction back.
        "INSERT INTO test.scratch WITH RECURSIVE s(n) AS \
         (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < 200) SELECT n FROM s"
            .to_owned(),
        // `expires_at` is in no secondary index: the row itself is locked, as the fence locks
        // it (a read an index covers locks only the index's entry).
        format!(
            "SELECT owner, expires_at FROM {SCHEMA}.entries WHERE lock_key = '{lock}' \
             LOCK IN SHARE MODE"
        ),
    ] {
        sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
            .execute(&mut app)
            .await
            .unwrap();
    }
    let backend = backend(&server.url(), Duration::from_secs(5));
    let acquire = tokio::spawn({
        let backend = backend.clone();
        async move {
            let guard = Lock::new("deadlocked")
                .on(&backend)
                .wait(Duration::from_secs(10))
                .acquire()
                .await?;
            guard.release().await
        }
    });
    // The join holds the key's row and waits for the expired entry's.
    let waited = until_a_lock_wait(&server);
    assert!(
        waited,
        "the join never waited for the row (the acquire finished: {}); row lock waits: {}; \
         sessions: {}",
        acquire.is_finished(),
        row_lock_waits(&server),
        server.sql("SELECT ID, COMMAND, STATE, INFO FROM information_schema.PROCESSLIST"),
    );
    let closing =
        format!("SELECT lock_key FROM {SCHEMA}.locks WHERE lock_key = '{lock}' FOR UPDATE");
    sqlx::raw_sql(sqlx::AssertSqlSafe(closing))
        .execute(&mut app)
        .await
        .expect("InnoDB rolls the join back, not the application's larger transaction");
    sqlx::raw_sql("COMMIT").execute(&mut app).await.unwrap();
    let released = acquire.await.unwrap();
    let after = deadlocks(&server);
    eprintln!(
        "MYSQL deadlock: {} detected; the acquire answered {released:?}",
        after - before
    );
    assert!(after > before, "no deadlock happened");
    released.expect("the join sent again after the deadlock is granted the lock");
}
