//! What the PostgreSQL and MySQL tests share about their database: the [`Database`] trait the
//! harness's server handles implement (`PgServer`, `MariaDbServer`; in `postgres.rs` and
//! `mysql.rs`), which names the SQL, the faults and the application's side of a fenced write
//! that differ between the two, and the conformance fixture [`Sql`] on a server of either.

use super::{Fixture, PREFIX};
use distlock::{Backend, BackendBuilder, LockError, LockGuard};
use distlock_test_support::{MariaDbServer, PgServer, RedisServer};
use std::any::Any;
use std::future::Future;
use std::time::Duration;

/// The lock schema (PostgreSQL) or database (MySQL) the fixtures install and the backends use.
pub const SCHEMA: &str = "distlock";

/// A connection of `D`'s sqlx driver (`PgConnection`, `MySqlConnection`).
pub type Connection<D> = <<D as Database>::Sqlx as sqlx::Database>::Connection;

/// A database server of the harness's own, and what the application does on it through sqlx.
pub trait Database: Sized + Send + Sync + 'static {
    /// The prefix of the figures the tests print (`POSTGRES`, `MYSQL`).
    const FIGURES: &'static str;
    /// The engine's name, as the CLI spells it (`distlock schema <kind>`) and the fixture's kind.
    const KIND: &'static str;
    /// The lock rows' key column.
    const KEY_COLUMN: &'static str;
    /// The lock rows' key, as text.
    const KEY_TEXT: &'static str;
    /// The database's clock, as the lock rows' `expires_at` counts it.
    const NOW: &'static str;
    /// A query that counts the transactions sessions have left open (its own session aside).
    const OPEN_TRANSACTIONS: &'static str;
    /// What the doctor's finding says of the harness's relaxed durability.
    const RELAXED_DURABILITY: &'static str;
    /// What follows the columns of the application's table (its engine, on MySQL).
    const TABLE_OPTIONS: &'static str;
    /// Whether a lock's release waits for an open transaction its fence ran in (MySQL: the fence
    /// locks the row the release deletes).
    const RELEASE_WAITS_FOR_FENCE: bool;
    /// The sqlx driver the application uses.
    type Sqlx: sqlx::Database;

    /// A new server, without the lock schema.
    fn start() -> Self;
    /// The SQL that installs the lock schema `name`, as `distlock schema <kind>` prints it.
    fn schema(name: &str) -> String;
    /// The URL a backend, or the application, connects with.
    fn url(&self) -> String;
    /// Runs `sql` with the database's own client, as its superuser; answers what it printed.
    fn sql(&self, sql: &str) -> String;
    /// Crashes the server (`SIGKILL`, or an immediate shutdown).
    fn kill(&mut self);
    /// Starts the server again after [`kill`](Self::kill).
    fn restart(&mut self);
    /// Ends every connection of the locks' user but the harness's own; answers how many.
    fn end_lock_connections(&self) -> usize;
    /// Ends the session `id` (its [`session_id`](Self::session_id)), as a network cut would.
    fn end_session(&self, id: u64);
    /// Waits up to `within` until `check` holds, woken by the database's changes and expiries.
    fn until(
        &self,
        within: Duration,
        check: impl AsyncFnMut() -> bool,
    ) -> impl Future<Output = bool>;

    /// A backend on the application's own pool (`Backend::postgres`, `Backend::mysql`).
    fn backend_on(pool: &sqlx::Pool<Self::Sqlx>) -> BackendBuilder;
    /// Fences the transaction on `connection` for the locks of the call it runs in.
    fn fence(
        connection: &mut Connection<Self>,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
    /// Fences the transaction on `connection` for the locks of `guard`.
    fn fence_guard(
        guard: &LockGuard,
        connection: &mut Connection<Self>,
    ) -> impl Future<Output = Result<(), LockError>> + Send;
    /// The recipe for a table of the application's own, its values bound: the write names its
    /// token and applies only if no newer token wrote the row. Answers the rows written (0 or 1).
    fn write_with_token(
        app: &sqlx::Pool<Self::Sqlx>,
        token: u64,
        value: &str,
    ) -> impl Future<Output = u64> + Send;
    /// Runs the statement `sql` on `connection`; answers the rows it changed.
    fn execute(connection: &mut Connection<Self>, sql: String) -> impl Future<Output = u64> + Send;
    /// The server's id of the session on `connection`.
    fn session_id(connection: &mut Connection<Self>) -> impl Future<Output = u64> + Send;

    /// A new server with the lock schema installed (by the SQL `distlock::<kind>::schema`
    /// prints, as a migration would).
    fn with_schema() -> Self {
        let server = Self::start();
        server.sql(&Self::schema(SCHEMA));
        server
    }

    /// Creates the application's table the fenced writes go to: one row, its value and the
    /// highest token that wrote it.
    fn create_resource(&self) {
        self.sql(&format!(
            "CREATE TABLE resource (id INT PRIMARY KEY, fence BIGINT NOT NULL, \
             value VARCHAR(100) NOT NULL){}; \
             INSERT INTO resource VALUES (1, 0, 'none')",
            Self::TABLE_OPTIONS
        ));
    }

    /// The application's row: its value and the token that wrote it, as `<value> <token>`.
    fn resource_value(&self) -> String {
        self.sql("SELECT CONCAT(value, ' ', fence) FROM resource WHERE id = 1")
    }

    /// How many transactions sessions have left open.
    fn open_transactions(&self) -> usize {
        self.sql(Self::OPEN_TRANSACTIONS).parse().unwrap()
    }

    /// Live lock rows (holders and waiters) under the tests' prefix.
    fn live_rows(&self) -> usize {
        self.sql(&format!(
            "SELECT COUNT(*) FROM {SCHEMA}.entries WHERE {} LIKE '{PREFIX}:%' AND expires_at > {}",
            Self::KEY_COLUMN,
            Self::NOW
        ))
        .parse()
        .unwrap()
    }
}

/// A SQL backend on a server of its own: [`Postgres`](super::Postgres) or
/// [`Mysql`](super::Mysql).
pub struct Sql<D> {
    pub server: D,
    backend: Backend,
    builder: BackendBuilder,
}

impl<D: Database> Sql<D> {
    /// A server with the lock schema installed.
    pub fn server() -> D {
        D::with_schema()
    }
}

impl<D: Database> Fixture for Sql<D> {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let server = D::with_schema();
        let builder = configure(Backend::builder(server.url()).prefix(PREFIX));
        Sql {
            backend: builder.clone().build().expect("valid settings"),
            builder,
            server,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    /// A SQL database keeps no token marker: a sequence (PostgreSQL) or AUTO_INCREMENT (MySQL)
    /// hands the tokens out, and never goes back.
    async fn forget_token_marker(&self, _key: &str) {}

    /// The time left of the holder's lease row, on the database's clock.
    async fn pttl(&self, key: &str) -> Option<Duration> {
        let holder = self.backend.inspect(key).await.unwrap()?;
        Some(holder.ttl)
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    /// Keys among `candidates` with a live row left: a holder, or a waiter, which would hold
    /// up everyone behind it.
    async fn held_keys(&self, candidates: &[String]) -> Vec<String> {
        let rows = self.server.sql(&format!(
            "SELECT DISTINCT {} FROM {SCHEMA}.entries WHERE expires_at > {}",
            D::KEY_TEXT,
            D::NOW
        ));
        let live: Vec<&str> = rows.lines().collect();
        candidates
            .iter()
            .filter(|key| live.contains(&format!("{PREFIX}:{{{key}}}").as_str()))
            .cloned()
            .collect()
    }

    fn kind(&self) -> &'static str {
        D::KIND
    }

    fn servers(&self) -> Vec<&RedisServer> {
        Vec::new()
    }

    fn least_token(&self) -> u64 {
        1
    }

    fn grants_in_a_row(&self) -> usize {
        2_000
    }

    fn postgres(&self) -> Option<&PgServer> {
        (&self.server as &dyn Any).downcast_ref()
    }

    fn mysql(&self) -> Option<&MariaDbServer> {
        (&self.server as &dyn Any).downcast_ref()
    }
}
