//! The MySQL and MariaDB deployment (`mysql://`, feature `mysql`): locks as lease rows of a
//! table, on the database's clock (`UTC_TIMESTAMP(6)`), their order and fencing tokens from an
//! `AUTO_INCREMENT` column.
//!
//! A store of the queue engine (`engines/queue/`), which decides who holds, joins, wakes and
//! answers operators; this directory is what only MySQL does. Each request is one `CALL` of a
//! procedure of the lock database (`schema.sql`, which `distlock schema mysql` prints), on a few
//! connections of distlock's own (`client.rs`), with its values written in as hex literals
//! (`sql.rs`). MySQL tells no change to another connection: a waiter is woken instead by a named
//! lock each entry holds while it lives (`presence.rs`, `wakes.rs`); see docs/design.md, "MySQL".
//! `fence.rs` makes an application's own transaction commit only while its lock is held.

#[cfg(feature = "mysql")]
mod client;
#[cfg(feature = "mysql")]
mod constructors;
#[cfg(feature = "mysql")]
pub(crate) mod fence;
#[cfg(feature = "mysql")]
mod presence;
#[cfg(feature = "mysql")]
mod spec;
#[cfg(feature = "mysql")]
pub(crate) mod sql;
#[cfg(feature = "mysql")]
mod store;
#[cfg(feature = "mysql")]
mod url;
#[cfg(feature = "mysql")]
mod wakes;

use crate::engines::spec::{Parser, Registration};

/// `mysql://` and `mariadb://`: parsed in builds with the `mysql` feature, named as missing in
/// the others.
pub(crate) const REGISTRATION: Registration = Registration {
    schemes: &["mysql", "mariadb"],
    forms: "mysql://user@host:port/database",
    #[cfg(feature = "mysql")]
    parser: Parser::Url(|url| Ok(std::sync::Arc::new(url::MySqlSpec::parse(url)?))),
    #[cfg(not(feature = "mysql"))]
    parser: Parser::Missing {
        feature: "mysql",
        what: "a MySQL or MariaDB database",
    },
    list: None,
};
