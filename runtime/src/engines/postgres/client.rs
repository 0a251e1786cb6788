//! How the PostgreSQL store reads its database's errors: the engine's failures, with advice
//! where the user can act. Its connections are the database stores' (`engines/sql/`).

use crate::engines::engine::EngineFailure;
use crate::engines::sql::connection;
use crate::util::tls_advice::{self, Hints};
use sqlx::postgres::{PgConnectOptions, Postgres};

/// The store's connections.
pub(crate) type Connection = connection::Connection<Postgres>;

/// Connections with `options`: every request is one simple-protocol query with its values
/// written in (see `sql::render`), so no statement is kept prepared (and, as on every
/// connection of the database stores, sqlx's statement log, which would show the owners, is off).
pub(crate) fn connect(
    options: PgConnectOptions,
    timeouts: crate::engines::settings::Timeouts,
    describe: String,
) -> Connection {
    let options = options.statement_cache_capacity(0);
    Connection::new(options, timeouts, describe, "PostgreSQL", failure)
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
