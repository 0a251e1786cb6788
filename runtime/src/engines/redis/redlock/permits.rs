//! Semaphores over Redlock: a permit is one of N *slots*, each an exclusive Redlock lock.
//!
//! Counting holders per master does not bound the holders of quorums: with 5 masters, a quorum
//! of 3 and N permits per master, N + 1 holders can each win 3 masters while no master grants
//! more than N once N ≥ 2 (3·(N+1) ≤ 5·N). A slot is exclusive by the Redlock argument, so N
//! slots admit at most N holders — whatever the masters' clocks and failures do.
//!
//! A caller tries the slots one after another from a slot its owner token picks (callers spread
//! over the slots), and holds the first it wins; the engine remembers which slot each owner
//! holds, for renewals and the release. A release whose slot it does not know (an attempt whose
//! reply was lost) gives back every slot the owner may hold.

use super::RedlockEngine;
use crate::engines::engine::{Acquired, Asker, EngineResult, GrantedAs, Ownership, Renewal};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use futures_util::future::join_all;
use std::time::Duration;

/// The key of a semaphore's slot. `}` cannot appear in a user's key (`key::validate`), so no
/// lock a user names can be a slot.
pub(super) fn slot_key(key: &str, slot: u32) -> String {
    format!("{key}}}permit{slot}")
}

impl RedlockEngine {
    /// Takes one of `permits` slots of `key` for `owner`, or finds them all busy.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As an exclusive acquire: a dropped attempt may hold a slot; the caller's cleanup releases
    /// with the same owner, which gives back every slot it may hold.
    pub(super) async fn acquire_permit(
        &self,
        key: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        permits: u32,
    ) -> EngineResult<Acquired> {
        let first = first_slot(owner, permits);
        let mut soonest: Option<Duration> = None;
        for offset in 0..permits {
            let slot = (first + offset) % permits;
            let names = self.names(&slot_key(key, slot));
            match self
                .acquire_names(&names, owner, ttl, asker, LockKind::Exclusive, false)
                .await?
            {
                Acquired::Yes { fence } => {
                    self.permit_slots
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(owner.as_str().to_owned(), slot);
                    return Ok(Acquired::Yes { fence });
                }
                Acquired::Busy { ttl, .. } => {
                    soonest = match (soonest, ttl) {
                        (Some(a), Some(b)) => Some(a.min(b)),
                        (a, b) => a.or(b),
                    }
                }
                other => return Ok(other),
            }
        }
        Ok(Acquired::busy(soonest))
    }

    /// Gives `owner`'s slot back (every slot, when which one is not known).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// The owner's slot is forgotten before the release is sent. Dropped, the caller releases
    /// again with the same owner (`release.rs`), which then gives back every slot it may hold.
    pub(super) async fn release_permit(
        &self,
        key: &str,
        owner: &Owner,
        permits: u32,
    ) -> EngineResult<Ownership> {
        let slot = self
            .permit_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(owner.as_str());
        if let Some(slot) = slot {
            let names = self.names(&slot_key(key, slot));
            return self
                .release_names(&names, owner, LockKind::Exclusive, GrantedAs::Unknown)
                .await;
        }
        let releases = (0..permits).map(|slot| async move {
            let names = self.names(&slot_key(key, slot));
            self.release_names(&names, owner, LockKind::Exclusive, GrantedAs::Unknown)
                .await
        });
        let mut outcome = Ownership::Gone;
        for released in join_all(releases).await {
            if released? == Ownership::Ours {
                outcome = Ownership::Ours;
            }
        }
        Ok(outcome)
    }

    /// What each lease of a renewal renews: a permit renews its slot (an exclusive lock).
    pub(super) fn renewal_targets<'a>(
        &self,
        batch: &[Renewal<'a>],
    ) -> (Vec<String>, Vec<(String, Renewal<'a>)>) {
        let slots = self.permit_slots.lock().unwrap_or_else(|e| e.into_inner());
        let targets: Vec<(String, Renewal<'a>)> = batch
            .iter()
            .map(|item| match item.kind {
                LockKind::Permits(_) => {
                    // An unknown slot renews nothing, and the lease is reported lost.
                    let slot = slots.get(item.owner.as_str()).copied().unwrap_or(u32::MAX);
                    let renewal = Renewal {
                        kind: LockKind::Exclusive,
                        ..*item
                    };
                    (slot_key(item.key, slot), renewal)
                }
                _ => (item.key.to_owned(), *item),
            })
            .collect();
        let locks = targets
            .iter()
            .map(|(key, _)| self.names(key).lock)
            .collect();
        (locks, targets)
    }
}

/// The slot an owner tries first: its token's first hex digits, so callers spread over the
/// slots and a retry by the same owner starts where its first try did.
fn first_slot(owner: &Owner, permits: u32) -> u32 {
    let hex = owner.as_str().get(..8).unwrap_or("0");
    u32::from_str_radix(hex, 16).unwrap_or(0) % permits.max(1)
}
