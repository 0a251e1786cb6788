//! [`Backend::in_process`] and [`Backend::in_process_builder`].

use super::spec::InProcessSpec;
use crate::backend::{Backend, BackendBuilder};
use std::sync::Arc;

impl Backend {
    /// The in-process backend: the same semantics as Redis (TTL expiry, ownership, fencing,
    /// validity) inside this process, for demos and unit tests.
    ///
    /// ```
    /// let backend = distlock::Backend::in_process();
    /// # let _ = backend;
    /// ```
    pub fn in_process() -> Backend {
        Backend::in_process_builder()
            .build()
            .expect("the default settings are valid")
    }

    /// A builder for the in-process backend, to adjust its settings.
    pub fn in_process_builder() -> BackendBuilder {
        BackendBuilder::new(Ok(Arc::new(InProcessSpec)))
    }
}
