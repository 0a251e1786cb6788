//! Joins in flight, so that a leave never overtakes the join it undoes.
//!
//! A store may run the requests of one client concurrently (etcd does, over one connection; a
//! database pool does, over several): a delete sent after a write on its way can be applied
//! first, and then the write leaves an entry nobody will delete — a waiter's place that holds up
//! everyone behind it until its time ends. That is what a cancelled acquire would do (its
//! attempt releases in the background while its join is still on the wire), so a join runs to
//! its end in a task of its own, whoever waits for it, and a leave of the same entry waits until
//! it has.

use super::store::{Read, Store};
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// An entry: its queue's key and its owner.
type EntryId = (String, String);

/// The entries whose join is on its way, each with a flag set when it ended.
#[derive(Default)]
pub(crate) struct Joining {
    pending: Arc<Mutex<HashMap<EntryId, watch::Receiver<bool>>>>,
}

impl Joining {
    /// Runs `store`'s join of `owner`'s entry in `key`'s queue in a task that finishes it even
    /// if the caller stops waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the join running to its end, and a leave of the
    /// entry waits for that end ([`settled`](Self::settled)).
    pub(crate) async fn join<S: Store>(
        &self,
        store: &Arc<S>,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> EngineResult<Read<S::Lease>> {
        let id: EntryId = (key.to_owned(), owner.as_str().to_owned());
        let (done, ended) = watch::channel(false);
        self.lock().insert(id.clone(), ended);
        let pending = self.pending.clone();
        let (store, owner) = (store.clone(), owner.clone());
        let join = tokio::spawn(async move {
            let answer = store.join(&id.0, &owner, kind, ttl).await;
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            // A newer join of the same entry (a retry) keeps its own flag.
            if pending
                .get(&id)
                .is_some_and(|ended| ended.same_channel(&done.subscribe()))
            {
                pending.remove(&id);
            }
            let _ = done.send(true);
            answer
        });
        match join.await {
            Ok(answer) => answer,
            Err(err) => Err(EngineFailure::ambiguous(format!("the join stopped: {err}"))),
        }
    }

    /// Resolves once no join of `owner`'s entry in `key`'s queue is on its way.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub(crate) async fn settled(&self, key: &str, owner: &Owner) {
        let id: EntryId = (key.to_owned(), owner.as_str().to_owned());
        let ended = self.lock().get(&id).cloned();
        if let Some(mut ended) = ended {
            // The task ended either way when its sender is gone.
            let _ = ended.wait_for(|ended| *ended).await;
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<EntryId, watch::Receiver<bool>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}
