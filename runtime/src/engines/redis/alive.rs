//! A flag that says whether a background task (and what it holds) is still there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Owned by a task: clears the flag when the task ends, however it ends (returned, aborted,
/// dropped with its runtime).
pub(crate) struct AliveFlag(pub(crate) Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}
