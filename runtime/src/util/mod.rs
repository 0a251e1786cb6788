//! Helpers with no knowledge of locks: glob patterns, URL authorities and their redaction, and
//! tables that give memory back.

pub(crate) mod advised;
pub(crate) mod glob;
pub(crate) mod hosts;
pub(crate) mod redact;
pub(crate) mod sparse;
pub(crate) mod tls_advice;
