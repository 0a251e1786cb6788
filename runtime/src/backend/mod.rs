//! Backends: where locks live, as users configure and register them. [`Backend`] is the handle;
//! [`BackendBuilder`] picks an engine (`crate::engines`) from a URL and hands it to one.

mod build;
pub(crate) mod builder;
pub(crate) mod config;
pub(crate) mod handle;
mod ping;
pub(crate) mod registry;
mod shutdown;

pub use builder::BackendBuilder;
pub use handle::{Backend, MIN_LEASE};
pub use shutdown::SHUTDOWN_TIMEOUT;
