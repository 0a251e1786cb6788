//! MySQL as the tests' [`Database`]: the harness's `MariaDbServer`, its SQL, and the
//! application's fenced writes through sqlx; the fixture [`Mysql`] on it, and waiting until a
//! check on it holds.

use super::database::{Database, Sql};
use distlock::{Backend, BackendBuilder, LockError, LockGuard};
use distlock_test_support::MariaDbServer;
use sqlx::{AssertSqlSafe, MySqlConnection, MySqlPool};
use std::future::Future;
use std::time::{Duration, Instant};

pub use super::database::SCHEMA;

/// The MySQL backend on a MariaDB server of its own.
pub type Mysql = Sql<MariaDbServer>;

impl Database for MariaDbServer {
    const FIGURES: &'static str = "MYSQL";
    const KIND: &'static str = "mysql";
    const KEY_COLUMN: &'static str = "lock_key";
    /// The column is VARBINARY.
    const KEY_TEXT: &'static str = "CAST(lock_key AS CHAR)";
    const NOW: &'static str = "UTC_TIMESTAMP(6)";
    /// InnoDB's open transactions. Read once, not polled: InnoDB refills `INNODB_TRX` only after
    /// it has gone unread for 100 ms.
    const OPEN_TRANSACTIONS: &'static str = "SELECT COUNT(*) FROM information_schema.INNODB_TRX \
        WHERE trx_mysql_thread_id <> CONNECTION_ID()";
    const RELAXED_DURABILITY: &'static str = "innodb_flush_log_at_trx_commit is 2";
    /// Transactional, whatever the server's default engine.
    const TABLE_OPTIONS: &'static str = " ENGINE = InnoDB";
    const RELEASE_WAITS_FOR_FENCE: bool = true;
    type Sqlx = sqlx::MySql;

    fn start() -> Self {
        MariaDbServer::start()
    }

    fn schema(name: &str) -> String {
        distlock::mysql::schema(name).unwrap()
    }

    fn url(&self) -> String {
        MariaDbServer::url(self)
    }

    fn sql(&self, sql: &str) -> String {
        MariaDbServer::sql(self, sql)
    }

    /// `SIGKILL`: the next start recovers from the InnoDB log.
    fn kill(&mut self) {
        MariaDbServer::kill(self)
    }

    fn restart(&mut self) {
        MariaDbServer::restart(self)
    }

    /// `KILL CONNECTION` of the connections of `root`.
    fn end_lock_connections(&self) -> usize {
        self.kill_connections("root")
    }

    fn end_session(&self, id: u64) {
        MariaDbServer::sql(self, &format!("KILL CONNECTION {id}"));
    }

    fn until(
        &self,
        within: Duration,
        check: impl AsyncFnMut() -> bool,
    ) -> impl Future<Output = bool> {
        until_on_mysql(self, within, check)
    }

    fn backend_on(pool: &MySqlPool) -> BackendBuilder {
        Backend::mysql(pool)
    }

    fn fence(
        connection: &mut MySqlConnection,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        distlock::mysql::fence(connection)
    }

    fn fence_guard(
        guard: &LockGuard,
        connection: &mut MySqlConnection,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        distlock::mysql::fence_guard(guard, connection)
    }

    async fn write_with_token(app: &MySqlPool, token: u64, value: &str) -> u64 {
        sqlx::query("UPDATE resource SET fence = ?, value = ? WHERE id = 1 AND fence <= ?")
            .bind(token)
            .bind(value)
            .bind(token)
            .execute(app)
            .await
            .unwrap()
            .rows_affected()
    }

    async fn execute(connection: &mut MySqlConnection, sql: String) -> u64 {
        let done = sqlx::query(AssertSqlSafe(sql)).execute(connection).await;
        done.unwrap().rows_affected()
    }

    /// `CONNECTION_ID()`.
    async fn session_id(connection: &mut MySqlConnection) -> u64 {
        let id = sqlx::query_scalar::<_, u64>("SELECT CONNECTION_ID()").fetch_one(connection);
        id.await.unwrap()
    }
}

/// Waits up to `within` until `check` holds, re-checked at every change of local state the
/// runtime's test hooks report (every actor of a conformance test is in this process) and when
/// the next row's time runs out (an expiry is no change in the database: nothing tells it, and
/// MySQL tells no change to another connection anyway).
pub async fn until_on_mysql(
    server: &MariaDbServer,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let step = next_expiry(server).unwrap_or(left).min(left);
        if distlock::__private::raw::until_local(step, &mut check).await {
            return true;
        }
        if Instant::now() >= deadline {
            return check().await;
        }
    }
}

/// How long until the next live row's time runs out (and a millisecond more).
fn next_expiry(server: &MariaDbServer) -> Option<Duration> {
    let ms = server.sql(&format!(
        "SELECT CEIL(TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), MIN(expires_at)) / 1000) \
         FROM {SCHEMA}.entries WHERE expires_at > UTC_TIMESTAMP(6)"
    ));
    let ms: u64 = ms.parse().ok()?;
    Some(Duration::from_millis(ms + 1))
}
