//! Efficiency locks on one server: a first try is one `SET NX PX`, the cheapest grant a Redis
//! server makes, and a release of a lock nobody waited for deletes the key with the smallest
//! compare-and-delete script.
//!
//! A node whose locks carry no fencing token ([`BackendBuilder::fencing_tokens`]`(false)`)
//! writes the value `acquire.lua` would write with token 0, `L0 <owner>[ <label>]`, only where
//! the key does not exist:
//!
//! ```text
//! SET <lock> "L0 <owner>[ <label>]" NX PX <ttl>
//! ```
//!
//! `OK` is a grant, the same value in the same key as a scripted grant, so every other script
//! (renewal, release, a waiter finding it busy) reads it as it reads any lock. A nil reply means
//! the key exists — held, a reader's or a release's reservation for notified waiters, a fenced
//! lock's token marker — and `acquire.lua` runs for the lock in a second round trip: it answers
//! busy, queues the caller and marks the lock waited on, or grants it (token 0) where it is free.
//! A key where a first try met a nil reply is
//! [contended](super::super::conditional::ContendedKeys): for a while its first tries go to the
//! script directly.
//!
//! Only first tries claim: a waiter asks by script, so that its place in the queue is kept. A
//! claim does not read the queue: a newcomer may take a lock whose holder's lease expired while
//! others were queued for it, ahead of them (they keep their places, and the release of the
//! newcomer hands it to the first of them). A release always hands a waited-on lock over
//! without freeing the key, so no claim can come between a release and its heir. A refused
//! claim leaves nothing on the server: the caller's place in line begins with the script that
//! follows it.
//!
//! A lock granted on its caller's first try, whose key is not known to be contended, is
//! released by `delete_if.lua`: the key is deleted if it still holds exactly the value granted
//! (a `GET` and a `DEL`, what a hand-written `SET NX` lock's release costs). A key that holds
//! anything else (waited on, expired, taken over) goes to `release.lua`, which tells which and
//! hands it over; the key is then contended for a while, and its releases go to `release.lua`
//! directly. The other locks of the batch are sent to `release.lua` at the same time.
//!
//! [`BackendBuilder::fencing_tokens`]: crate::BackendBuilder::fencing_tokens

use super::exclusive::{LockCall, Pipelined, ReleaseCall, ReleaseReply};
use super::{unexpected, Digits, Node};
use crate::engines::engine::{Acquired, Asker, EngineResult, Ownership};
use crate::engines::redis::conditional;
use crate::engines::redis::protocol::millis;
use crate::engines::redis::scripts::DELETE_IF;
use redis::{FromRedisValue, Value};
use std::time::Duration;

impl Node {
    /// Efficiency locks' acquire (no tokens): a `SET NX PX` for each first try whose key is not
    /// known to be contended, then `acquire.lua` for the rest and for the claims that found the
    /// key taken. One answer per lock, in order.
    ///
    /// # Cancel safety
    /// Not cancel safe: a claim or script already sent may still take the lock.
    /// As [`acquire_many`](Node::acquire_many): a dropped call may hold its locks; the callers
    /// release them with the owner tokens they keep.
    pub(super) async fn acquire_unfenced(
        &self,
        items: &[LockCall],
        grant_time: Option<Duration>,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        let claimable: Vec<usize> = (0..items.len())
            .filter(|i| claims(&items[*i]) && !self.contended.contains(&items[*i].lock))
            .collect();
        // The calls off the uncontended path are boxed, so that this future, made for every
        // acquire, stays small.
        if claimable.is_empty() {
            return Box::pin(self.acquire_by_script(items, 0, grant_time)).await;
        }
        let mut answers: Vec<Option<EngineResult<Acquired>>> =
            std::iter::repeat_with(|| None).take(items.len()).collect();
        let (claimed, acknowledged) = self.claim(items, &claimable).await?;
        let mut taken = Vec::new();
        for (index, took) in claimable.into_iter().zip(claimed) {
            match took {
                true => taken.push(index),
                false => self.contended.note(&items[index].lock),
            }
        }
        let granted = taken
            .iter()
            .map(|_| Ok(Acquired::Yes { fence: 0 }))
            .collect();
        let settled = match (self.replica_ack, acknowledged) {
            // Fewer replicas than wanted acknowledged the claims: they are taken back.
            (Some(ack), Some(acknowledged)) if acknowledged < ack.replicas && !taken.is_empty() => {
                let calls: Vec<LockCall> = taken.iter().map(|i| items[*i].clone()).collect();
                Box::pin(self.take_back_unreplicated(&calls, granted, ack, acknowledged)).await
            }
            _ => granted,
        };
        for (index, answer) in taken.iter().zip(settled) {
            answers[*index] = Some(answer);
        }
        let rest: Vec<usize> = (0..items.len()).filter(|i| answers[*i].is_none()).collect();
        if !rest.is_empty() {
            let pending: Vec<LockCall> = rest.iter().map(|i| items[*i].clone()).collect();
            let scripted = Box::pin(self.acquire_by_script(&pending, 0, grant_time))
                .await
                .map_err(|mut failure| {
                    // The claims took their locks: to their callers the failure must read as
                    // "may have run", so that their cleanup releases them.
                    failure.ambiguous |= !taken.is_empty();
                    failure
                })?;
            for (index, answer) in rest.into_iter().zip(scripted) {
                answers[index] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.ok_or_else(|| unexpected("acquire", "no answer")))
            .collect()
    }

    /// One pipeline (a plain command for a lone claim): `SET <lock> "L0 <owner>[ <label>]" NX
    /// PX <ttl>` for each of `items` at `indices`, then `WAIT` with replica acknowledgement.
    /// Whether each took its lock, and how many replicas acknowledged.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// Dropped after sending, the claims may still take their locks, as with a lost reply.
    async fn claim(
        &self,
        items: &[LockCall],
        indices: &[usize],
    ) -> EngineResult<(Vec<bool>, Option<u32>)> {
        let bound = self.connection().await?;
        let mut commands = indices
            .iter()
            .map(|index| self.claim_command(&items[*index]));
        let mut conn = bound.conn.clone();
        let sent = match (indices.len(), self.replica_ack) {
            // One claim alone: a plain command, cheaper to send and read than a pipeline.
            (1, None) => {
                let cmd = commands.next().expect("one claim");
                cmd.query_async::<Value>(&mut conn)
                    .await
                    .map(|reply| vec![reply])
            }
            (_, ack) => {
                let mut pipe = redis::pipe();
                commands.for_each(|cmd| {
                    pipe.add_command(cmd);
                });
                if let Some(ack) = ack {
                    pipe.cmd("WAIT")
                        .arg(ack.replicas)
                        .arg(millis::arg(ack.timeout));
                }
                pipe.query_async::<Vec<Value>>(&mut conn).await
            }
        };
        let replies = sent.map_err(|err| {
            // A reply late behind a WAIT says nothing about where the primary is.
            if !(self.replica_ack.is_some() && err.is_timeout()) {
                self.after_failure(&bound, &err);
            }
            let mut failure = self.failure(err);
            // One refused command fails the pipeline: the claims before it may have run.
            failure.ambiguous |= indices.len() > 1;
            failure
        })?;
        let expected = indices.len() + usize::from(self.replica_ack.is_some());
        if replies.len() != expected {
            return Err(unexpected("claim", replies));
        }
        let claimed = replies[..indices.len()]
            .iter()
            .map(|reply| match reply {
                Value::Okay => Ok(true),
                Value::Nil => Ok(false),
                other => Err(unexpected("claim", other)),
            })
            .collect::<EngineResult<Vec<bool>>>()?;
        let acknowledged = match self.replica_ack {
            Some(_) => Some(
                u32::from_redis_value(replies[indices.len()].clone())
                    .map_err(|err| unexpected("WAIT", err))?,
            ),
            None => None,
        };
        Ok((claimed, acknowledged))
    }
}

impl Node {
    /// Efficiency locks' releases: the quiet ones (`batch.quiet`) by `delete_if.lua`, the
    /// others by `release.lua`, both sent at once; a quiet one whose key held something else
    /// then by `release.lua` too. One answer per lock.
    ///
    /// # Cancel safety
    /// Not cancel safe: a release already sent may still run.
    /// As [`release_calls`](Node::release_calls): dropped after sending, some locks may be
    /// released; the caller finishes the release in the background, where a lock already
    /// released reads as gone.
    pub(super) async fn release_unfenced(
        &self,
        batch: Pipelined<'_>,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let Pipelined {
            items,
            quiet,
            scripted,
        } = batch;
        let keys: Vec<&str> = quiet.iter().map(|(i, _)| items[*i].lock.as_str()).collect();
        let values: Vec<Vec<u8>> = quiet
            .iter()
            .map(|(i, _)| conditional::granted_value(0, &items[*i].owner, &self.label))
            .collect();
        let args: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let others: Vec<ReleaseCall> = scripted.iter().map(|i| items[*i].clone()).collect();
        let delete = self.invoke::<Vec<i64>>(&DELETE_IF, &keys, &args);
        let (deleted, released) = match others.is_empty() {
            true => (delete.await, Ok(Vec::new())),
            // Boxed, as the rest of the calls off the uncontended path.
            false => {
                let script = self.release_by_script(&others, marker_ttl, reservation_window);
                futures_util::future::join(delete, Box::pin(script)).await
            }
        };
        let (deleted, released) = match (deleted, released) {
            (Ok(deleted), Ok(released)) => (deleted, released),
            (Err(mut failure), Ok(_)) | (Ok(_), Err(mut failure)) => {
                // The other half may have released its locks: to their callers the failure
                // must read as "may have run".
                failure.ambiguous = true;
                return Err(failure);
            }
            (Err(failure), Err(_)) => return Err(failure),
        };
        if deleted.len() != quiet.len() || released.len() != scripted.len() {
            return Err(unexpected("release", (deleted, released.len())));
        }
        let mut answers: Vec<Option<ReleaseReply>> = vec![None; items.len()];
        for ((index, _), deleted) in quiet.iter().zip(deleted) {
            match deleted {
                1 => answers[*index] = Some(ReleaseReply::Found(Ownership::Ours)),
                _ => self.contended.note(&items[*index].lock),
            }
        }
        for (index, answer) in scripted.iter().zip(released) {
            answers[*index] = Some(answer);
        }
        if answers.iter().all(Option::is_some) {
            return Ok(answers.into_iter().flatten().collect());
        }
        Box::pin(self.release_the_rest(items, answers, marker_ttl, reservation_window)).await
    }
}

impl Node {
    /// `SET <lock> "L0 <owner>[ <label>]" NX PX <ttl>` for `item`.
    fn claim_command(&self, item: &LockCall) -> redis::Cmd {
        let value = conditional::granted_value(0, &item.owner, &self.label);
        let ttl = Digits::ms(item.ttl);
        let mut cmd = redis::Cmd::with_capacity(6, item.lock.len() + value.len() + 32);
        cmd.arg("SET")
            .arg(&item.lock)
            .arg(value)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_bytes());
        cmd
    }
}

/// Whether `item` is a first try that a `SET NX` may grant: not a waiter (which asks by script,
/// keeping its place in the queue), nor a Redlock ticket holder.
fn claims(item: &LockCall) -> bool {
    item.asker != Asker::Waiting && item.ticket.is_none()
}
