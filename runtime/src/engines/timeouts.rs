//! How long a Redis connection waits: for a reply, for a connection.

use std::time::Duration;

/// Network timeouts of a Redis connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            response: Duration::from_millis(500),
            connect: Duration::from_secs(1),
        }
    }
}
