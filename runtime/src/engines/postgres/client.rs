//! The store's connections to PostgreSQL: a small pool of its own, opened lazily from the
//! application's connect options, every request bounded by the response timeout, and the
//! database's errors read as the engine's failures, with advice where the user can act.
//!
//! The pool is distlock's, never the application's: a body that holds every connection of the
//! application's pool (in a transaction, say) cannot keep its own lock from being renewed or
//! released, and a lock taken inside it cannot wait for a connection the body holds.

use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::settings::Timeouts;
use crate::util::tls_advice::{self, Hints};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::ConnectOptions;
use std::future::Future;
use std::sync::OnceLock;

/// Connections of the store's pool: enough for the watchdog, a few acquires and releases at
/// once, and the listening connection.
const POOL_SIZE: u32 = 8;

pub(crate) struct Connection {
    options: PgConnectOptions,
    /// Opened at the first request, on the runtime it runs on: a backend is built outside
    /// any runtime too (sqlx's pool starts its tasks when it is made).
    pool: OnceLock<PgPool>,
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
        // Every request is one simple-protocol query with its values written in (see
        // `sql::render`), so sqlx's statement log — which would show the owners, secrets — is
        // off on these connections; no statement is kept prepared.
        Connection {
            options: options
                .statement_cache_capacity(0)
                .disable_statement_logging(),
            pool: OnceLock::new(),
            timeouts,
            describe,
        }
    }

    /// The pool; made (no connection opened yet) at the first call, which must be on a
    /// runtime.
    pub(crate) fn pool(&self) -> &PgPool {
        self.pool.get_or_init(|| {
            PgPoolOptions::new()
                .max_connections(POOL_SIZE)
                .min_connections(0)
                .acquire_timeout(self.timeouts.connect)
                .connect_lazy_with(self.options.clone())
        })
    }

    /// How long a request waits for a row another transaction has locked (a fenced
    /// transaction's lease row): the response timeout, so that the database gives up first and
    /// says why, and no connection of the pool is held waiting longer.
    pub(crate) fn lock_wait_ms(&self) -> i64 {
        self.timeouts.response.as_millis().max(1) as i64
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

/// What to set, in the URL, about a TLS handshake that failed.
const TLS_HINTS: Hints<'static> = Hints {
    ca: "set `sslrootcert` in the URL to the CA's file (with `sslmode=verify-full`)",
    client: "set `sslcert` and `sslkey` in the URL",
    plain: "a server without TLS takes `sslmode=disable` (or `prefer`)",
    client_cert: true,
};

/// A failed request: ambiguous unless the database said what it refused (then nothing was
/// applied: the transaction rolled back) or no connection was had.
pub(crate) fn failure(err: sqlx::Error, schema: &str) -> EngineFailure {
    let refused = |source: String| EngineFailure {
        ambiguous: false,
        source: source.into(),
    };
    if let sqlx::Error::Io(_) | sqlx::Error::Tls(_) = &err {
        // A handshake that failed carried no request.
        if let Some(advice) = tls_advice::advice(&err, &TLS_HINTS) {
            return refused(format!("{err}; {advice}"));
        }
    }
    match &err {
        sqlx::Error::Database(db) => match db.code().as_deref() {
            // undefined_function, undefined_table, invalid_schema_name
            Some("42883" | "42P01" | "3F000") => refused(format!(
                "{err}: the database has no distlock schema `{schema}`; run the SQL that \
                 `distlock schema postgres --schema {schema}` prints (or \
                 distlock::postgres::schema(\"{schema}\")), or let distlock create it \
                 (BackendBuilder::create_schema)"
            )),
            // lock_not_available: `lock_timeout` ran out
            Some("55P03") => refused(format!(
                "{err}: a transaction of the application has the lock's row locked — a fenced \
                 write (distlock::postgres::fence) still open after its lease ran out, or a \
                 lock released before its fenced transaction ended; commit or roll that \
                 transaction back first"
            )),
            // insufficient_privilege
            Some("42501") => refused(format!(
                "{err}: the user lacks a right distlock needs; grant it what `distlock acl \
                 postgres --schema {schema} --user <user>` prints"
            )),
            // invalid_authorization_specification, on a host that must use TLS
            Some("28000") if db.message().contains("no encryption") => refused(format!(
                "{err}: the server takes only TLS connections from this host; set \
                 `sslmode=verify-full` and `sslrootcert` (the CA's file) in the URL"
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
