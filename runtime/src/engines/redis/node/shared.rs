//! Readers and permits (`shared_acquire.lua`, `shared_release.lua`) as typed calls.

use super::{ms_arg, Node, ReleaseReply};
use crate::engines::engine::{Acquired, Asker, EngineFailure, EngineResult, Ownership};
use crate::engines::redis::diagnose;
use crate::engines::redis::protocol::{asker_arg, Acquire, SharedAcquire, SharedRelease};
use crate::engines::redis::scripts::{SHARED_ACQUIRE, SHARED_RELEASE};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use std::time::Duration;

impl Node {
    /// `shared_acquire.lua`: a reader or a permit of `lock` (already prefixed) for `owner`. With
    /// replica acknowledgement, a grant the replicas did not confirm is released again
    /// ([`Acquired::Unreplicated`]).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`invoke`](Self::invoke): a dropped call may hold the key; the caller's cleanup
    /// releases it with the same owner.
    pub(crate) async fn acquire_shared(
        &self,
        lock: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        let holders = crate::lock::key::holders_of(lock);
        let (letter, permits) = match kind {
            LockKind::Permits(n) => ("M", n),
            _ => ("R", 0),
        };
        let permits = permits.to_string();
        let member = self.member(owner);
        let ttl_ms = ms_arg(ttl);
        let args: [&[u8]; 5] = [
            letter.as_bytes(),
            permits.as_bytes(),
            &member,
            &ttl_ms,
            &[asker_arg(asker)],
        ];
        let (answer, acknowledged): ([i64; 2], _) = self
            .invoke_acked(&SHARED_ACQUIRE, &[lock, &holders], &args, self.replica_ack)
            .await?;
        let answer = Acquire::from(SharedAcquire::decode(answer[0], answer[1])?);
        let acquired = answer.acquired(None, lock, kind, || diagnose::foreign_key(lock))?;
        match (self.replica_ack, acknowledged, acquired) {
            (Some(ack), Some(acknowledged), Acquired::Yes { .. })
                if acknowledged < ack.replicas =>
            {
                self.release_shared(lock, owner, ack.marker_ttl, Duration::ZERO)
                    .await
                    .map_err(|failure| EngineFailure {
                        ambiguous: true,
                        source: failure.source,
                    })?;
                Ok(Acquired::Unreplicated {
                    acknowledged,
                    wanted: ack.replicas,
                    timeout: ack.timeout,
                })
            }
            _ => Ok(acquired),
        }
    }

    /// `shared_release.lua`: the reader or permit `owner` of `lock` (already prefixed) leaves.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`invoke`](Self::invoke): dropped after sending, the holder may have left all the same;
    /// the caller releases again with the same owner (`release.rs`, or an acquire's cleanup),
    /// where a holder already gone reads as gone.
    pub(crate) async fn release_shared(
        &self,
        lock: &str,
        owner: &Owner,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let holders = crate::lock::key::holders_of(lock);
        let member = self.member(owner);
        let marker_ms = ms_arg(marker_ttl);
        let window = ms_arg(reservation_window);
        let args: [&[u8]; 4] = [&member, &marker_ms, &window, self.publish.as_bytes()];
        let code: i64 = self
            .invoke(&SHARED_RELEASE, &[lock, &holders], &args)
            .await?;
        Ok(match SharedRelease::decode(code)? {
            SharedRelease::Released => ReleaseReply::Found(Ownership::Ours),
            SharedRelease::ReleasedUnannounced => ReleaseReply::ReleasedUnannounced,
            SharedRelease::Expired => ReleaseReply::Found(Ownership::Gone),
        })
    }

    /// A shared holder's member among the key's holders: `<owner> <label>`.
    pub(super) fn member(&self, owner: &Owner) -> Vec<u8> {
        let mut member = Vec::with_capacity(owner.as_bytes().len() + 1 + self.label.len());
        member.extend_from_slice(owner.as_bytes());
        member.push(b' ');
        member.extend_from_slice(&self.label);
        member
    }
}
