//! Backends: where locks live, as users configure and register them. [`Backend`] is the handle;
//! [`BackendBuilder`] picks an engine (`crate::engines`) from a URL and hands it to one.

pub(crate) mod builder;
pub(crate) mod handle;
pub(crate) mod operator;

pub use builder::BackendBuilder;
pub use handle::{Backend, MIN_LEASE};
pub use operator::{HeldLock, LockEvent, LockEventKind, LockEvents, Notifications};
