//! What operators ask of Redlock: which locks are held, removing one, following one — on every
//! master, read as a quorum would.

use super::fan_out::{all, fan_out, summarize};
use super::RedlockEngine;
use crate::engines::engine::{EngineResult, Holder};
use crate::engines::redis::keyspace;
use crate::operating::key_events::{KeyEventSender, Notifications};
use futures_util::future::join_all;
use std::collections::{BTreeSet, HashMap};

/// Operator calls are not on a lock's clock: they may take this many per-master timeouts.
const OPERATOR_PATIENCE: u32 = 20;

impl RedlockEngine {
    /// The keys found on the masters that answered (a lock held by a quorum is on at least one
    /// of any quorum); fewer than a quorum answering is the error.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only: dropping the future changes nothing.
    pub(super) async fn list_keys(&self, pattern: &str) -> EngineResult<Vec<String>> {
        let answers = fan_out(
            &self.masters,
            self.master_timeout * OPERATOR_PATIENCE,
            |master| master.node.scan(pattern),
            all,
        )
        .await;
        let mut keys = BTreeSet::new();
        let mut failures = Vec::new();
        let mut answered = 0;
        for (master, answer) in self.masters.iter().zip(answers) {
            match answer.expect("every master is waited for") {
                Ok(found) => {
                    answered += 1;
                    keys.extend(found);
                }
                Err(failure) => failures.push((master.address.clone(), failure)),
            }
        }
        if answered < self.quorum {
            return Err(summarize("list", failures, self.masters.len(), self.quorum));
        }
        Ok(keys.into_iter().collect())
    }

    /// Removes the lock on every master that answers; the holder removed from the most
    /// masters. Fewer than a quorum answering is the error (the lock may live on).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Dropped after the requests left, the lock may still be removed (and its waiters woken) on
    /// the masters that got one, and not on the others.
    pub(super) async fn force_unlock_all(&self, key: &str) -> EngineResult<Option<Holder>> {
        let names = self.names(key);
        let answers = fan_out(
            &self.masters,
            self.master_timeout * OPERATOR_PATIENCE,
            |master| master.node.force_unlock(&names, self.marker_ttl),
            all,
        )
        .await;
        let mut removed: HashMap<String, Vec<Holder>> = HashMap::new();
        let mut failures = Vec::new();
        let mut answered = 0;
        for (master, answer) in self.masters.iter().zip(answers) {
            match answer.expect("every master is waited for") {
                Ok(holder) => {
                    answered += 1;
                    if let Some(holder) = holder {
                        removed
                            .entry(holder.owner.clone())
                            .or_default()
                            .push(holder);
                    }
                }
                Err(failure) => failures.push((master.address.clone(), failure)),
            }
        }
        if answered < self.quorum {
            return Err(summarize(
                "unlock",
                failures,
                self.masters.len(),
                self.quorum,
            ));
        }
        // The holder's token is the one a quorum recorded, as inspect reads it: the quorum-th
        // lowest of its copies (a vote that landed late on another master may be higher).
        Ok(removed
            .into_values()
            .max_by_key(Vec::len)
            .map(|mut copies| {
                copies.sort_by_key(|copy| copy.fencing_token);
                let at = (self.quorum - 1).min(copies.len() - 1);
                copies.swap_remove(at)
            }))
    }

    /// Follows the key on every master; a master that is down is followed in the background
    /// from the start (its events come once it is back). A master refusing (notifications off,
    /// no `CONFIG` right) is the error.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future drops the follows still subscribing, with their connections; the
    /// followers already started end once the caller's `KeyEvents` is dropped, as it is with a
    /// dropped `Backend::events`.
    pub(super) async fn follow_all(
        &self,
        key: &str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> EngineResult<()> {
        let lock = self.names(key).lock;
        let followers = self.masters.iter().map(|master| {
            keyspace::follow(
                master.node.client_source(),
                lock.clone(),
                notifications,
                master.node.timeouts(),
                true,
                events.clone(),
            )
        });
        join_all(followers).await.into_iter().collect()
    }
}
