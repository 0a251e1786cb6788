//! A database store's connections: a small pool of its own, opened lazily from the
//! application's connect options, every request bounded by the response timeout, and the
//! database's errors read as the engine's failures by the store's own reading of them.
//!
//! The pool is distlock's, never the application's: a body that holds every connection of the
//! application's pool (in a transaction, say) cannot keep its own lock from being renewed or
//! released, and a lock taken inside it cannot wait for a connection the body holds.

use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use sqlx::pool::{Pool, PoolOptions};
use sqlx::{AssertSqlSafe, Database};
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Connections of the store's pool: enough for the watchdog, a few acquires and releases at
/// once, and a listening connection.
const POOL_SIZE: u32 = 8;

/// How a store reads a failed request of its database, given its schema.
pub(crate) type ReadFailure = fn(sqlx::Error, &str) -> EngineFailure;

/// Whether a store creates its schema when it is missing (`create_schema`), and whether that
/// was done (or found there): once per backend.
pub(crate) struct Creation {
    wanted: bool,
    done: OnceCell<()>,
}

impl Creation {
    pub(crate) fn new(wanted: bool) -> Creation {
        Creation {
            wanted,
            done: OnceCell::new(),
        }
    }
}

pub(crate) struct Connection<DB: Database> {
    options: <DB::Connection as sqlx::Connection>::Options,
    /// Opened at the first request, on the runtime it runs on: a backend is built outside
    /// any runtime too (sqlx's pool starts its tasks when it is made).
    pool: OnceLock<Pool<DB>>,
    timeouts: Timeouts,
    /// The most connections open at once.
    size: u32,
    /// `postgres://user@host:port/database` and the like, for messages.
    describe: String,
    /// The database's name, for messages: `PostgreSQL`, `MySQL`.
    database: &'static str,
    failure: ReadFailure,
}

impl<DB: Database> Connection<DB> {
    /// Connections with `options`, made to log no statement: the stores' statements hold
    /// owners, which are secrets.
    pub(crate) fn new(
        options: <DB::Connection as sqlx::Connection>::Options,
        timeouts: Timeouts,
        describe: String,
        database: &'static str,
        failure: ReadFailure,
    ) -> Connection<DB> {
        Connection {
            options: sqlx::ConnectOptions::disable_statement_logging(options),
            pool: OnceLock::new(),
            size: POOL_SIZE,
            timeouts,
            describe,
            database,
            failure,
        }
    }

    /// The same with at most `size` connections open at once.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn with_size(mut self, size: u32) -> Connection<DB> {
        self.size = size;
        self
    }

    /// The pool; made (no connection opened yet) at the first call, which must be on a
    /// runtime.
    pub(crate) fn pool(&self) -> &Pool<DB> {
        self.pool.get_or_init(|| {
            PoolOptions::<DB>::new()
                .max_connections(self.size)
                .min_connections(0)
                .acquire_timeout(self.timeouts.connect)
                .connect_lazy_with(self.options.clone())
        })
    }

    /// How long a request waits for a row another transaction has locked (a fenced
    /// transaction's lease row): the response timeout, so that the database gives up first and
    /// says why, and no connection of the pool is held waiting longer.
    pub(crate) fn lock_wait(&self) -> Duration {
        self.timeouts.response
    }

    /// The connect options its connections are opened with.
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    pub(crate) fn options(&self) -> &<DB::Connection as sqlx::Connection>::Options {
        &self.options
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
    }

    /// Makes sure of the schema `creation` creates, where that was asked for: runs its SQL
    /// (`sql`, every statement of which may run again) at the first call, and again only after
    /// a call that failed.
    ///
    /// # Cancel safety
    /// Not cancel safe: the statements may have run, as after a lost reply; the next call runs
    /// them again.
    pub(crate) async fn ensure(
        &self,
        creation: &Creation,
        schema: &str,
        sql: impl FnOnce() -> String,
    ) -> EngineResult<()>
    where
        for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    {
        if !creation.wanted {
            return Ok(());
        }
        creation
            .done
            .get_or_try_init(|| async {
                let sql = sql();
                self.call(
                    schema,
                    sqlx::raw_sql(AssertSqlSafe(sql)).execute(self.pool()),
                )
                .await
                .map(|_| ())
            })
            .await
            .copied()
    }

    /// Runs one request, bounded by the connect and response timeouts; a request that timed
    /// out or broke may have been applied (ambiguous).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: a request already sent may still be applied (and committed). Callers
    /// treat both alike (see [`Engine`](crate::engines::engine::Engine)).
    pub(crate) async fn call<T, F>(&self, schema: &str, request: F) -> EngineResult<T>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        self.call_blocking(Duration::ZERO, schema, request).await
    }

    /// [`call`](Self::call) for a request that blocks in the server for up to `blocks` by
    /// design (MySQL's `GET_LOCK`): bounded by that too.
    ///
    /// # Cancel safety
    /// As [`call`](Self::call).
    pub(crate) async fn call_blocking<T, F>(
        &self,
        blocks: Duration,
        schema: &str,
        request: F,
    ) -> EngineResult<T>
    where
        F: Future<Output = Result<T, sqlx::Error>>,
    {
        let budget = self.timeouts.connect + self.timeouts.response + blocks;
        match tokio::time::timeout(budget, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err((self.failure)(err, schema)),
            Err(_) => Err(EngineFailure::ambiguous(format!(
                "{} did not answer in time",
                self.database
            ))),
        }
    }
}
