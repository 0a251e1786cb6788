//! PostgreSQL as the tests' [`Database`]: the harness's `PgServer`, its SQL, and the
//! application's fenced writes through sqlx; the fixture [`Postgres`] on it, and waiting until a
//! check on it holds.

use super::database::{Database, Sql};
use distlock::{Backend, BackendBuilder, LockError, LockGuard};
use distlock_test_support::PgServer;
use sqlx::postgres::PgListener;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use std::future::Future;
use std::time::{Duration, Instant};

pub use super::database::SCHEMA;

/// The PostgreSQL backend on a server of its own.
pub type Postgres = Sql<PgServer>;

impl Database for PgServer {
    const FIGURES: &'static str = "POSTGRES";
    const KIND: &'static str = "postgres";
    const KEY_COLUMN: &'static str = "key";
    const KEY_TEXT: &'static str = "key";
    const NOW: &'static str = "clock_timestamp()";
    /// Sessions `idle in transaction`.
    const OPEN_TRANSACTIONS: &'static str = "SELECT count(*) FROM pg_stat_activity \
        WHERE state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()";
    const RELAXED_DURABILITY: &'static str = "fsync is off";
    const TABLE_OPTIONS: &'static str = "";
    const RELEASE_WAITS_FOR_FENCE: bool = false;
    type Sqlx = sqlx::Postgres;

    fn start() -> Self {
        PgServer::start()
    }

    fn schema(name: &str) -> String {
        distlock::postgres::schema(name).unwrap()
    }

    fn url(&self) -> String {
        PgServer::url(self)
    }

    fn sql(&self, sql: &str) -> String {
        self.psql(sql)
    }

    /// An immediate shutdown.
    fn kill(&mut self) {
        PgServer::kill(self)
    }

    fn restart(&mut self) {
        PgServer::restart(self)
    }

    /// `pg_terminate_backend` of the sessions of `postgres`.
    fn end_lock_connections(&self) -> usize {
        self.terminate_connections("postgres")
    }

    fn end_session(&self, id: u64) {
        self.psql(&format!("SELECT pg_terminate_backend({id})"));
    }

    fn until(
        &self,
        within: Duration,
        check: impl AsyncFnMut() -> bool,
    ) -> impl Future<Output = bool> {
        until_on_postgres(self, within, check)
    }

    fn backend_on(pool: &PgPool) -> BackendBuilder {
        Backend::postgres(pool)
    }

    fn fence(connection: &mut PgConnection) -> impl Future<Output = Result<(), LockError>> + Send {
        distlock::postgres::fence(connection)
    }

    fn fence_guard(
        guard: &LockGuard,
        connection: &mut PgConnection,
    ) -> impl Future<Output = Result<(), LockError>> + Send {
        distlock::postgres::fence_guard(guard, connection)
    }

    async fn write_with_token(app: &PgPool, token: u64, value: &str) -> u64 {
        sqlx::query("UPDATE resource SET fence = $1, value = $2 WHERE id = 1 AND fence <= $1")
            .bind(token as i64)
            .bind(value)
            .execute(app)
            .await
            .unwrap()
            .rows_affected()
    }

    async fn execute(connection: &mut PgConnection, sql: String) -> u64 {
        let done = sqlx::query(AssertSqlSafe(sql)).execute(connection).await;
        done.unwrap().rows_affected()
    }

    /// `pg_backend_pid()`.
    async fn session_id(connection: &mut PgConnection) -> u64 {
        let pid = sqlx::query_scalar::<_, i32>("SELECT pg_backend_pid()").fetch_one(connection);
        pid.await.unwrap() as u64
    }
}

/// Waits up to `within` until `check` holds, re-checked at every change the schema's channel
/// tells (a join, a renewal, a deletion) and when the next row's time runs out (an expiry is
/// no change in the database: nothing tells it).
pub async fn until_on_postgres(
    server: &PgServer,
    within: Duration,
    mut check: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    let mut listener = PgListener::connect(&server.url()).await.unwrap();
    // Listening before the first check: no change after it is missed.
    listener.listen(SCHEMA).await.unwrap();
    loop {
        if check().await {
            return true;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let next_expiry = next_expiry(server).unwrap_or(left).min(left);
        match tokio::time::timeout(next_expiry, listener.recv()).await {
            Ok(Ok(_)) => {}
            Ok(Err(err)) => panic!("the test's PostgreSQL listener failed: {err}"),
            Err(_) if Instant::now() >= deadline => return check().await,
            Err(_) => {}
        }
    }
}

/// How long until the next live row's time runs out (and a millisecond more).
fn next_expiry(server: &PgServer) -> Option<Duration> {
    let ms = server.psql(&format!(
        "SELECT ceil(extract(epoch FROM min(expires_at) - clock_timestamp()) * 1000)::bigint \
         FROM {SCHEMA}.entries WHERE expires_at > clock_timestamp()"
    ));
    let ms: u64 = ms.parse().ok()?;
    Some(Duration::from_millis(ms + 1))
}
