//! The task-local call context: which locks the running task holds, for [`checkpoint()`],
//! [`fencing_token()`], [`is_held()`] and reentrancy.
//!
//! The context is task-local: it does not follow work into `tokio::spawn`ed tasks, which are not
//! part of the locked call.

use crate::backend::Backend;
use crate::lock::kind::LockKind;
use crate::lock::lease::HeldLease;
use crate::LockError;
use std::future::Future;
use std::sync::Arc;

/// The locks one locked call added, and the frames of the calls around it.
pub(crate) struct Frame {
    pub(crate) backend: Backend,
    pub(crate) leases: Vec<Arc<HeldLease>>,
    pub(crate) parent: Option<Arc<Frame>>,
}

tokio::task_local! {
    static CURRENT: Arc<Frame>;
}

pub(crate) fn current() -> Option<Arc<Frame>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// Runs `body` with `frame` as the task's call context.
///
/// # Cancel safety
/// As cancel safe as `body`.
/// Dropping the future drops `body` and the frame with it.
pub(crate) async fn scope<F: Future>(frame: Arc<Frame>, body: F) -> F::Output {
    CURRENT.scope(frame, body).await
}

impl Frame {
    fn chain(self: &Arc<Self>) -> impl Iterator<Item = &Frame> {
        std::iter::successors(Some(&**self), |frame| frame.parent.as_deref())
    }

    /// Every lock of this call and of the calls around it, with its backend.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) fn held(self: &Arc<Self>) -> impl Iterator<Item = (&Backend, &Arc<HeldLease>)> {
        self.chain().flat_map(|frame| {
            frame
                .leases
                .iter()
                .map(move |lease| (&frame.backend, lease))
        })
    }

    /// How this task already holds `key` on `backend` (the outermost hold), if it does.
    pub(crate) fn held_as(self: &Arc<Self>, backend: &Backend, key: &str) -> Option<LockKind> {
        self.chain()
            .filter(|frame| frame.backend.same_as(backend))
            .flat_map(|frame| frame.leases.iter())
            .filter(|lease| lease.key == key)
            .map(|lease| lease.kind)
            .last()
    }

    /// Every lock of this call and of the calls around it must still be held: work inside a nested
    /// call is unprotected as soon as any enclosing lock is gone.
    fn check(self: &Arc<Self>) -> Result<(), LockError> {
        self.chain()
            .flat_map(|frame| frame.leases.iter())
            .try_for_each(|lease| lease.check())
    }
}

/// Stops the work if its lock is gone: `Err(LockError::Lost)` once the lease is lost (or its
/// validity ran out — a paused process learns it here, on its first check after waking).
///
/// Annotated functions call it between top-level statements; call it yourself inside loops and
/// deep call chains. Outside a locked call it is `Err(LockError::NoContext)`.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// use distlock::{Backend, Lock};
///
/// let backend = Backend::in_process();
/// Lock::new("report:daily").on(&backend).run(async {
///     for _page in 0..3 {
///         distlock::checkpoint()?; // stop before the next page if the lock was lost
///     }
///     Ok::<_, distlock::LockError>(())
/// })
/// .await??;
/// assert!(distlock::checkpoint().is_err());
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// - [`LockError::Lost`] once a lock of this call, or of a locked call around it, is lost or
///   its validity has run out; the error names the key and the reason.
/// - [`LockError::NoContext`] outside a locked call, including in a task spawned from one
///   (the context does not follow `tokio::spawn`).
pub fn checkpoint() -> Result<(), LockError> {
    CURRENT
        .try_with(|frame| frame.check())
        .unwrap_or(Err(LockError::NoContext))
}

/// The fencing token of the lock this call holds (the innermost locked call; with several keys,
/// the first in canonical order), or `None` outside a locked call. Pass it to the resource you
/// write, which must reject tokens older than the newest it has seen (see
/// [`FencedStore`](crate::redis::FencedStore)).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), distlock::LockError> {
/// let backend = distlock::Backend::in_process();
/// let token = distlock::Lock::new("k").on(&backend).run(async { distlock::fencing_token() }).await?;
/// assert!(token.is_some());
/// assert_eq!(distlock::fencing_token(), None);
/// # Ok(())
/// # }
/// ```
pub fn fencing_token() -> Option<u64> {
    CURRENT
        .try_with(|frame| {
            frame
                .chain()
                .find_map(|frame| frame.leases.first())
                .map(|lease| lease.fence)
        })
        .ok()
        .flatten()
}

/// `true` inside a locked call whose locks are all still held and valid; `false` otherwise.
///
/// ```
/// assert!(!distlock::is_held());
/// ```
pub fn is_held() -> bool {
    CURRENT
        .try_with(|frame| frame.check().is_ok())
        .unwrap_or(false)
}
