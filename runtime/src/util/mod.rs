//! Helpers with no knowledge of locks: glob patterns, URL authorities and their redaction, SQL
//! identifiers, and tables that give memory back.

pub(crate) mod advised;
pub(crate) mod glob;
pub(crate) mod hosts;
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) mod identifier;
pub(crate) mod redact;
pub(crate) mod sparse;
pub(crate) mod tls_advice;
