//! Backends for tests: run a test's locked calls against a backend of its own, without the
//! process-wide [`Registry`](crate::Registry) — so tests in one binary, each with its own
//! `"default"`, neither collide nor share locks.
//!
//! ```
//! use distlock::{distributed_lock, Backend, LockError};
//!
//! #[distributed_lock(key = "job:<id>")]
//! async fn run(id: u64) -> Result<u64, LockError> {
//!     Ok(id)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // In each test: an in-process backend of its own, as `"default"`.
//! let backend = Backend::in_process();
//! let answer = distlock::testing::scope(backend.clone(), async { run(7).await }).await;
//! assert_eq!(answer.unwrap(), 7);
//! assert_eq!(backend.stats().acquired, 1);
//! # }
//! ```

use crate::backend::Backend;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static SCOPED: Arc<HashMap<String, Backend>>;
}

/// Runs `body` with `backend` as the `"default"` backend: every lock in it that names no backend
/// (`#[distributed_lock]` without `backend = …`, `Lock::new(…)` without `.on(…)`) uses `backend`,
/// ahead of the registry. See [`scope_as`].
///
/// # Cancel safety
/// This function is as cancel safe as `body`. Dropping the future drops `body` (its locks
/// release as any dropped call's do), and the scope ends with it.
pub async fn scope<F: Future>(backend: Backend, body: F) -> F::Output {
    scope_as(crate::backend::registry::DEFAULT_BACKEND, backend, body).await
}

/// Runs `body` with `backend` as the backend named `name`, ahead of the registry; scopes nest
/// (the inner one adds or replaces names). The scope is task-local, as tokio's task-locals are:
/// a task spawned inside it does not inherit it (wrap the spawned future in `scope_as` too).
///
/// # Cancel safety
/// This function is as cancel safe as `body`, as [`scope`].
pub async fn scope_as<F: Future>(name: &str, backend: Backend, body: F) -> F::Output {
    let mut backends = SCOPED
        .try_with(|outer| HashMap::clone(outer))
        .unwrap_or_default();
    backends.insert(name.to_owned(), backend);
    SCOPED.scope(Arc::new(backends), body).await
}

/// The backend a scope around the current task gives `name`, if any.
pub(crate) fn scoped(name: &str) -> Option<Backend> {
    SCOPED
        .try_with(|backends| backends.get(name).cloned())
        .ok()
        .flatten()
}
