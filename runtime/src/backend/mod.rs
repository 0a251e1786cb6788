//! Backends: where locks live, as users configure and register them. [`Backend`] is the handle;
//! [`BackendBuilder`] picks an engine (`crate::engines`) from a URL and hands it to one.

mod build;
pub(crate) mod builder;
pub(crate) mod config;
pub(crate) mod handle;
mod ping;
pub(crate) mod registry;
mod shutdown;
pub(crate) mod spec;

pub use builder::BackendBuilder;
pub use handle::{Backend, MIN_LEASE};
pub use shutdown::SHUTDOWN_TIMEOUT;

#[cfg(test)]
mod tests {
    use super::Backend;
    use crate::LostReason;
    use std::time::Duration;

    /// The names renamed for one word per fact keep working, with a deprecation warning.
    #[test]
    #[allow(deprecated)]
    fn the_old_names_still_work() {
        let backend = Backend::builder("memory://")
            .watchdog_timeout(Duration::from_secs(2))
            .fence_counter_ttl(Duration::from_secs(5))
            .build()
            .unwrap();
        assert_eq!(backend.watchdog_timeout(), Duration::from_secs(2));
        assert_eq!(backend.watchdog_lease(), Duration::from_secs(2));
        assert_eq!(backend.kind(), "in-process");
        assert_eq!(backend.deployment(), "in-process");
        assert_eq!(LostReason::Stolen, LostReason::TakenOver);
        assert!(matches!(LostReason::TakenOver, LostReason::Stolen));
        let stats = backend.stats();
        assert_eq!(stats.release_found_foreign, stats.release_taken_over);
    }
}
