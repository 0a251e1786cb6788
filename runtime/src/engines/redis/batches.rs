//! The lock scripts of one server as [`Batched`] calls, for [`GroupCommit`]: concurrent acquires
//! (and releases) of one engine go to the server as one script call.
//!
//! [`GroupCommit`]: super::group_commit::GroupCommit

use super::group_commit::Batched;
use super::node::{
    reservation_window, LockCall, Node, ReleaseCall, ReleaseReply, RESERVATION_WINDOW,
};
use crate::engines::engine::{Acquired, EngineResult};
use crate::hooks::SharedHooks;
use crate::wait::retry_until;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `acquire.lua` over a batch of locks.
pub(crate) struct AcquireBatch {
    pub(crate) node: Arc<Node>,
    pub(crate) marker_ttl: Duration,
}

impl Batched for AcquireBatch {
    type Item = LockCall;
    type Answer = EngineResult<Acquired>;

    fn run<'a>(&'a self, items: &'a [LockCall]) -> BoxFuture<'a, EngineResult<Vec<Self::Answer>>> {
        Box::pin(self.node.acquire_many(items, 1))
    }

    /// A grant is released; so is a busy reply that queued the caller (the
    /// release gives that place up, or releases the lock if it was handed over since):
    /// the caller's own background release may have run before this batch did.
    fn abandoned(self: &Arc<Self>, item: LockCall, answer: Self::Answer) {
        if let Ok(Acquired::Yes { .. } | Acquired::Busy { next: Some(_), .. }) = answer {
            self.release_left_behind(item);
        }
    }

    fn abandoned_unanswered(self: &Arc<Self>, item: LockCall) {
        self.release_left_behind(item);
    }
}

impl AcquireBatch {
    /// Releases a lock its caller left behind (an ownership-checked release: harmless if the lock
    /// was not taken). A failed release is tried again, with backoff, until the lock would have
    /// expired anyway (its TTL from now); then it is left to that TTL, and logged.
    fn release_left_behind(self: &Arc<Self>, item: LockCall) {
        release_left_behind(
            self.node.clone(),
            self.marker_ttl,
            ReleaseCall::plain(item.lock, item.owner),
            item.ttl,
        );
    }
}

/// Releases a lock whose caller left before a batch it was in was answered (an
/// ownership-checked release: harmless if the lock was not taken). A failed release is tried
/// again, with backoff, until the lock would have expired anyway (`ttl` from now); then it is
/// left to that TTL, and logged.
fn release_left_behind(node: Arc<Node>, marker_ttl: Duration, call: ReleaseCall, ttl: Duration) {
    tokio::spawn(async move {
        let until = Instant::now() + ttl;
        let calls = [call];
        let release = || node.release_by_script(&calls, marker_ttl, RESERVATION_WINDOW);
        let Err(failure) = release().await else {
            return;
        };
        let released = retry_until(|| until, LEFT_BEHIND_RETRY_CAP, failure, release).await;
        if let Err(failure) = released {
            tracing::warn!(
                target: "distlock::release",
                error = %failure.source,
                "a lock whose caller left before its batch was answered could not be released; \
                 it expires by its TTL"
            );
        }
    });
}

/// The longest pause between two tries of a release left behind.
const LEFT_BEHIND_RETRY_CAP: Duration = Duration::from_secs(1);

/// A batch of releases: conditional writes for first-try grants where the server has them,
/// `release.lua` for the rest ([`Node::release_calls`]).
pub(crate) struct ReleaseBatch {
    pub(crate) node: Arc<Node>,
    pub(crate) marker_ttl: Duration,
    pub(crate) hooks: SharedHooks,
}

impl Batched for ReleaseBatch {
    type Item = ReleaseCall;
    type Answer = ReleaseReply;

    fn run<'a>(
        &'a self,
        items: &'a [ReleaseCall],
    ) -> BoxFuture<'a, EngineResult<Vec<ReleaseReply>>> {
        let window = reservation_window(&self.hooks);
        Box::pin(self.node.release_calls(items, self.marker_ttl, window))
    }

    /// A release is done whether or not its caller is still there. Nor is a transfer undone
    /// here: a caller that leaves before learning a transfer's outcome releases its key in the
    /// background naming the successor's pledged token too, so that one script frees the key
    /// whichever token holds it (`release.rs`, `transfer_left_unfinished`).
    fn abandoned(self: &Arc<Self>, _item: ReleaseCall, _answer: ReleaseReply) {}

    /// The caller that left hands its unconfirmed release — and the lock a transfer in it may
    /// have granted — to a background task of its own (`release.rs`), which sends it again.
    fn abandoned_unanswered(self: &Arc<Self>, _item: ReleaseCall) {}
}
