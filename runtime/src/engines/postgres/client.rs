//! The store's connections to PostgreSQL: a small pool of its own, opened lazily from the
//! application's connect options, every request bounded by the response timeout, and the
//! database's errors read as the engine's failures, with advice where the user can act.
//!
//! The pool is distlock's, never the application's: a body that holds every connection of the
//! application's pool (in a transaction, say) cannot keep its own lock from being renewed or
//! released, and a lock taken inside it cannot wait for a connection the body holds.

use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use std::future::Future;

/// Connections of the store's pool: enough for the watchdog, a few acquires and releases at
/// once, and the listening connection.
const POOL_SIZE: u32 = 8;

pub(crate) struct Connection {
    pool: PgPool,
    timeouts: Timeouts,
    /// `the PostgreSQL database … at host:port`, for messages.
    describe: String,
}

impl Connection {
    pub(crate) fn new(
        options: PgConnectOptions,
        timeouts: Timeouts,
        describe: String,
    ) -> Connection {
        // Every statement is sent unnamed (`persistent(false)`): a transaction-mode pooler may
        // run two statements of one connection on two server connections.
        let options = options.statement_cache_capacity(0);
        let pool = PgPoolOptions::new()
            .max_connections(POOL_SIZE)
            .min_connections(0)
            .acquire_timeout(timeouts.connect)
            .connect_lazy_with(options);
        Connection {
            pool,
            timeouts,
            describe,
        }
    }

    pub(crate) fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub(crate) fn describe(&self) -> &str {
        &self.describe
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
        let budget = self.timeouts.connect + self.timeouts.response;
        match tokio::time::timeout(budget, request).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(err)) => Err(failure(err, schema)),
            Err(_) => Err(EngineFailure::ambiguous(
                "PostgreSQL did not answer in time",
            )),
        }
    }
}

/// A failed request: ambiguous unless the database said what it refused (then nothing was
/// applied: the transaction rolled back) or no connection was had.
pub(crate) fn failure(err: sqlx::Error, schema: &str) -> EngineFailure {
    let refused = |source: String| EngineFailure {
        ambiguous: false,
        source: source.into(),
    };
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // undefined_function, undefined_table, invalid_schema_name
            Some("42883" | "42P01" | "3F000") => refused(format!(
                "{err}: the database has no distlock schema `{schema}`; run the SQL that \
                 `distlock schema postgres --schema {schema}` prints (or \
                 distlock::postgres::schema(\"{schema}\")), or let distlock create it \
                 (BackendBuilder::create_schema)"
            )),
            // insufficient_privilege
            Some("42501") => refused(format!(
                "{err}: the user may not use the lock tables; grant it what `distlock schema \
                 postgres --schema {schema}` lists"
            )),
            // read_only_sql_transaction: a standby
            Some("25006") => refused(format!(
                "{err}: the server is a standby (read-only); point the backend at the primary"
            )),
            _ => refused(err.to_string()),
        },
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            refused(format!("could not connect to PostgreSQL in time ({err})"))
        }
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => refused(err.to_string()),
        _ => EngineFailure::ambiguous(err),
    }
}
