//! What operators ask of a queue: who holds a lock, which locks have a queue, and breaking one.

use super::order::{holds, Entry};
use super::store::Store;
use super::QueueEngine;
use crate::engines::engine::{EngineResult, Holder};
use crate::lock::kind::LockKind;
use crate::util::glob::glob_match;
use std::collections::BTreeSet;
use std::time::Duration;

impl<S: Store> QueueEngine<S> {
    /// Who holds a lock whose queue is `entries`: its writer, or its readers or permits
    /// together (the longest-living one's time left, the newest one's token).
    async fn holder(&self, key: &str, entries: &[Entry<S::Lease>]) -> Option<Holder> {
        let holding: Vec<&Entry<S::Lease>> = (0..entries.len())
            .filter(|&place| holds(entries, place))
            .map(|place| &entries[place])
            .collect();
        let newest = holding.last()?;
        let mut ttl = Duration::ZERO;
        for entry in &holding {
            ttl = ttl.max(
                self.store
                    .time_left(key, entry)
                    .await
                    .unwrap_or(Duration::ZERO),
            );
        }
        let shared = entries[0].kind.is_some_and(LockKind::is_shared);
        let waiting = (entries.len() - holding.len()) as u64;
        Some(Holder {
            owner: match shared {
                true => String::new(),
                false => newest.owner.clone(),
            },
            fencing_token: newest.token,
            ttl,
            label: Some(newest.label.clone()).filter(|label| !label.is_empty()),
            waited_on: waiting > 0,
            waiting: Some(waiting),
            shared: shared.then_some(holding.len() as u64),
        })
    }

    pub(super) async fn inspect_key(&self, key: &str) -> EngineResult<Option<Holder>> {
        let entries = self.store.read(key).await?;
        Ok(self.holder(key, &entries).await)
    }

    /// Keys matching `pattern` that have a queue.
    pub(super) async fn list_keys(&self, pattern: &str) -> EngineResult<Vec<String>> {
        let keys: BTreeSet<String> = self
            .store
            .keys()
            .await?
            .into_iter()
            .filter(|key| glob_match(pattern, key))
            .collect();
        Ok(keys.into_iter().collect())
    }

    /// Removes `key`'s holders (their entries, if they are still the ones read); the next in
    /// the queue hold the lock from then on, with larger tokens.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Like a lost reply: some holders may have been removed, each removal whole.
    pub(super) async fn unlock(&self, key: &str) -> EngineResult<Option<Holder>> {
        let entries = self.store.read(key).await?;
        let Some(holder) = self.holder(key, &entries).await else {
            return Ok(None);
        };
        let mut removed = false;
        for place in (0..entries.len()).filter(|&place| holds(&entries, place)) {
            removed |= self.store.remove(key, &entries[place]).await?;
        }
        // Released meanwhile: nobody was removed by this call.
        Ok(removed.then_some(holder))
    }
}
