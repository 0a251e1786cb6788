//! How the MySQL store reads its database's errors: the engine's failures, with advice where the
//! user can act. Its connections are the database stores' (`engines/sql/`).

use crate::engines::engine::EngineFailure;
use crate::engines::settings::Timeouts;
use crate::engines::sql::connection;
use crate::util::tls_advice::{self, Hints};
use sqlx::mysql::{MySql, MySqlConnectOptions};

/// The store's connections.
pub(crate) type Connection = connection::Connection<MySql>;

/// Connections with `options`: every request is one text-protocol statement with its values
/// written in (see `sql::render`), so no statement is kept prepared (and, as on every
/// connection of the database stores, sqlx's statement log, which would show the owners, is off).
pub(crate) fn connect(
    options: MySqlConnectOptions,
    timeouts: Timeouts,
    describe: String,
) -> Connection {
    let options = options.statement_cache_capacity(0);
    Connection::new(options, timeouts, describe, "MySQL", failure)
}

/// What to set, in the URL, about a TLS handshake that failed.
const TLS_HINTS: Hints<'static> = Hints {
    ca: "set `ssl-ca` in the URL to the CA's file (with `ssl-mode=VERIFY_IDENTITY`)",
    client: "set `ssl-cert` and `ssl-key` in the URL",
    plain: "a server without TLS takes `ssl-mode=DISABLED` (or `PREFERRED`)",
    client_cert: true,
};

/// The error numbers MySQL and MariaDB answer with, that the store gives advice for.
mod number {
    pub(super) const BAD_DB: u16 = 1049;
    pub(super) const NO_SUCH_TABLE: u16 = 1146;
    pub(super) const SP_DOES_NOT_EXIST: u16 = 1305;
    pub(super) const LOCK_WAIT_TIMEOUT: u16 = 1205;
    pub(super) const LOCK_DEADLOCK: u16 = 1213;
    pub(super) const DB_ACCESS_DENIED: u16 = 1044;
    pub(super) const TABLE_ACCESS_DENIED: u16 = 1142;
    pub(super) const PROC_ACCESS_DENIED: u16 = 1370;
    pub(super) const READ_ONLY: u16 = 1290;
    pub(super) const DATA_TOO_LONG: u16 = 1406;
    pub(super) const ACCESS_DENIED: u16 = 1045;
    pub(super) const SECURE_TRANSPORT_REQUIRED: u16 = 3159;
}

/// Whether a request that failed with `err` was refused only for a deadlock with another
/// transaction, and runs whole when sent again (it rolled back).
pub(crate) fn is_deadlock(err: &sqlx::Error) -> bool {
    matches!(err, sqlx::Error::Database(db)
        if db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .is_some_and(|db| db.number() == number::LOCK_DEADLOCK))
}

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
    let db_number = match &err {
        sqlx::Error::Database(db) => db
            .try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>()
            .map(|db| db.number()),
        _ => None,
    };
    if let Some(number) = db_number {
        return refused(advised(&err, number, schema));
    }
    match &err {
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => {
            refused(format!("could not connect to MySQL in time ({err})"))
        }
        sqlx::Error::Configuration(_) | sqlx::Error::Tls(_) => refused(err.to_string()),
        _ => EngineFailure::ambiguous(err),
    }
}

/// The database's refusal `err` (number `number`), with what to do about it.
fn advised(err: &sqlx::Error, number: u16, schema: &str) -> String {
    match number {
        number::BAD_DB | number::NO_SUCH_TABLE | number::SP_DOES_NOT_EXIST => format!(
            "{err}: the server has no distlock schema `{schema}`; run the SQL that `distlock \
             schema mysql --schema {schema}` prints (or distlock::mysql::schema(\"{schema}\")) \
             with the mysql or mariadb client, or let distlock create it \
             (BackendBuilder::create_schema)"
        ),
        number::LOCK_WAIT_TIMEOUT => format!(
            "{err}: a transaction of the application has the lock's row locked — a fenced write \
             (distlock::mysql::fence) still open after its lease ran out, or a lock released \
             before its fenced transaction ended; commit or roll that transaction back first"
        ),
        number::LOCK_DEADLOCK => {
            format!("{err}: the request deadlocked with other transactions each time it was sent")
        }
        number::DB_ACCESS_DENIED | number::TABLE_ACCESS_DENIED | number::PROC_ACCESS_DENIED => {
            format!(
                "{err}: the user lacks a right distlock needs; grant it what `distlock acl \
                 mysql --schema {schema} --user <user>` prints"
            )
        }
        number::READ_ONLY => {
            format!("{err}: the server is read-only (a replica?); point the backend at the primary")
        }
        number::DATA_TOO_LONG => format!(
            "{err}: a lock name is longer than the lock table's column ({} bytes)",
            super::sql::MAX_LOCK_NAME
        ),
        number::SECURE_TRANSPORT_REQUIRED => format!(
            "{err}: the server takes only TLS connections; set `ssl-mode=VERIFY_IDENTITY` and \
             `ssl-ca` (the CA's file) in the URL"
        ),
        // MariaDB refuses a plain connection to a server that requires TLS this way too.
        number::ACCESS_DENIED => format!(
            "{err}: the server refused the user — a wrong user or password, or a server that \
             takes only TLS connections (`require_secure_transport`) reached without TLS: then \
             set `ssl-mode=VERIFY_IDENTITY` and `ssl-ca` (the CA's file) in the URL"
        ),
        _ => err.to_string(),
    }
}
