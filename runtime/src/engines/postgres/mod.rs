//! The PostgreSQL deployment (`postgres://`, feature `postgres`): locks as lease rows of a
//! table, on the database's clock, their order and fencing tokens from a sequence.
//!
//! A store of the queue engine (`engines/queue/`), which decides who holds, joins, wakes and
//! answers operators; this directory is what only PostgreSQL does. Each request is one call of a
//! function of the lock schema (`sql.rs`, which `distlock schema postgres` prints), on a few
//! connections of distlock's own (`client.rs`); no session state is used — no advisory lock, no
//! prepared statement — so a transaction-mode pooler and a dropped connection change nothing.
//! Waiters are woken by `NOTIFY` on one listening connection (`listener.rs`), and poll where
//! notifications do not reach them. `fence.rs` makes an application's own transaction commit
//! only while its lock is held.

#[cfg(feature = "postgres")]
mod client;
#[cfg(feature = "postgres")]
mod constructors;
#[cfg(feature = "postgres")]
pub(crate) mod fence;
#[cfg(feature = "postgres")]
mod listener;
#[cfg(feature = "postgres")]
mod spec;
#[cfg(feature = "postgres")]
pub(crate) mod sql;
#[cfg(feature = "postgres")]
mod store;
#[cfg(feature = "postgres")]
mod url;

use crate::engines::spec::{Parser, Registration};

/// `postgres://` and `postgresql://`: parsed in builds with the `postgres` feature, named as
/// missing in the others.
pub(crate) const REGISTRATION: Registration = Registration {
    schemes: &["postgres", "postgresql"],
    forms: "postgres://user@host:port/database",
    #[cfg(feature = "postgres")]
    parser: Parser::Url(|url| Ok(std::sync::Arc::new(url::PgSpec::parse(url)?))),
    #[cfg(not(feature = "postgres"))]
    parser: Parser::Missing {
        feature: "postgres",
        what: "a PostgreSQL database",
    },
    list: None,
};
