//! Joins in flight, so that a release never overtakes the join it undoes.
//!
//! etcd runs the requests of one connection concurrently: a delete sent after a put on its way
//! can be applied first, and then the put leaves an entry nobody will delete — a waiter's place
//! that holds up everyone behind it until its lease ends. That is what a cancelled acquire
//! would do (its attempt releases in the background while its join is still on the wire), so a
//! join runs to its end in a task of its own, whoever waits for it, and a release of the same
//! entry waits until it has.

use super::client::Connection;
use crate::engines::engine::EngineResult;
use etcd_client::{Txn, TxnResponse};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// The entries whose join is on its way, each with a flag set when it ended.
#[derive(Default)]
pub(crate) struct Joining {
    pending: Arc<Mutex<HashMap<String, watch::Receiver<bool>>>>,
}

impl Joining {
    /// Sends `txn`, the join of `entry`, in a task that finishes it even if the caller stops
    /// waiting.
    ///
    /// # Cancel safety
    /// Cancel safe: dropping the future leaves the join running to its end, and a release of
    /// `entry` waits for that end ([`settled`](Self::settled)).
    pub(crate) async fn send(
        &self,
        connection: &Arc<Connection>,
        entry: String,
        txn: Txn,
    ) -> EngineResult<TxnResponse> {
        let (done, ended) = watch::channel(false);
        self.lock().insert(entry.clone(), ended);
        let pending = self.pending.clone();
        let connection = connection.clone();
        let join = tokio::spawn(async move {
            let answer = connection
                .call(|mut client| async move { client.txn(txn).await })
                .await;
            let mut pending = pending.lock().unwrap_or_else(|e| e.into_inner());
            // A newer join of the same entry (a retry) keeps its own flag.
            if pending
                .get(&entry)
                .is_some_and(|ended| ended.same_channel(&done.subscribe()))
            {
                pending.remove(&entry);
            }
            let _ = done.send(true);
            answer
        });
        match join.await {
            Ok(answer) => answer,
            Err(err) => Err(super::client::transient(format!("the join stopped: {err}"))),
        }
    }

    /// Resolves once no join of `entry` is on its way.
    ///
    /// # Cancel safety
    /// Cancel safe: it only waits.
    pub(crate) async fn settled(&self, entry: &str) {
        let ended = self.lock().get(entry).cloned();
        if let Some(mut ended) = ended {
            // The task ended either way when its sender is gone.
            let _ = ended.wait_for(|ended| *ended).await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, watch::Receiver<bool>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}
