//! The exclusive lock's scripts as typed calls: `acquire.lua` (batched), `release.lua` and the
//! conditional `SET … IFEQ` release beside it, the local transfer, and the fencing token's
//! write-back.

use super::{ms_arg, unexpected, Bound, Digits, Node, ReplicaAck};
use crate::engines::engine::{
    Acquired, Asker, EngineFailure, EngineResult, GrantedAs, Ownership, Transfer,
};
use crate::engines::redis::conditional;
use crate::engines::redis::diagnose;
use crate::engines::redis::handover_channel::HandoverChannel;
use crate::engines::redis::protocol::{
    asker_arg, asker_bytes, millis, Acquire, FenceWriteback, Release, UnknownReply,
};
use crate::engines::redis::scripts::{ACQUIRE, FENCE_WRITEBACK, RELEASE};
use crate::lock::key::KeyNames;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::wait::Successor;
use redis::{FromRedisValue, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// One lock of a batched acquire: its key (already prefixed), owner, lease TTL, and who asks.
#[derive(Debug, Clone)]
pub(crate) struct LockCall {
    pub(crate) lock: String,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) asker: Asker,
    /// The caller's place in line, should it queue (Redlock: the same on every master);
    /// `None`: behind everyone queued.
    pub(crate) ticket: Option<u64>,
}

/// Where an exclusive ask queues if it finds the lock busy, on a node whose waiters queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Not at all (a Redlock semaphore's slot: its waiters try every slot in turn).
    Unqueued,
    /// Behind everyone queued (one server).
    Behind,
    /// At this ticket (Redlock: the same on every master, so that their queues agree).
    At(u64),
}

/// One lock of a batched release: its key (already prefixed), its owner, how it was granted
/// (a first-try grant can be released by a conditional `SET` where the server has one), and the
/// local task it is transferred to if nobody else waits for it.
#[derive(Debug, Clone)]
pub(crate) struct ReleaseCall {
    pub(crate) lock: String,
    pub(crate) owner: Owner,
    pub(crate) granted: GrantedAs,
    pub(crate) successor: Option<Successor>,
    /// An owner that does not hold the lock keeps its place in the lock's queue (a Redlock vote
    /// given back after a failed attempt); otherwise it leaves the queue (an ended call).
    pub(crate) keeps_place: bool,
}

impl ReleaseCall {
    /// An ownership-checked release of `owner`'s lock, with nothing known of its grant.
    pub(crate) fn plain(lock: String, owner: Owner) -> ReleaseCall {
        ReleaseCall {
            lock,
            owner,
            granted: GrantedAs::Unknown,
            successor: None,
            keeps_place: false,
        }
    }

    /// `release.lua`'s argument for this lock: the owner token, followed by the successor's
    /// token and TTL for a transfer and, where waiters queue (`grant_time`), the successor's
    /// grant time, should the lock be handed over instead (the successor then queues for it),
    /// and ` +` if the transfer may go ahead of other processes' queued waiters. A successor
    /// with no TTL names a transfer that may have run: the lock is released if either token
    /// holds it.
    fn script_arg(&self, grant_time: Option<Duration>) -> std::borrow::Cow<'_, [u8]> {
        let Some(successor) = &self.successor else {
            if self.keeps_place {
                return format!("{} =", self.owner.as_str()).into_bytes().into();
            }
            return self.owner.as_bytes().into();
        };
        if successor.ttl.is_zero() {
            // Release whichever of the two tokens holds the lock (a transfer may have run).
            let arg = format!("{} {} 0", self.owner.as_str(), successor.owner.as_str());
            return arg.into_bytes().into();
        }
        let mut arg = format!(
            "{} {} {}",
            self.owner.as_str(),
            successor.owner.as_str(),
            millis::arg(successor.ttl)
        );
        if let Some(grant) = grant_time {
            use std::fmt::Write;
            let _ = write!(arg, " {}", grant_for(grant, successor.ttl).as_millis());
            if successor.ahead_of_waiter {
                arg.push_str(" +");
            }
        }
        arg.into_bytes().into()
    }
}

/// A queued waiter's grant time for a lease of `ttl` where the engine's is `grant`, as the
/// scripts compute it: the smaller of the two, in whole milliseconds.
fn grant_for(grant: Duration, ttl: Duration) -> Duration {
    Duration::from_millis(millis::arg(grant).min(millis::arg(ttl)))
}

/// How long the waiters a release notifies have the lock before anyone else (`release.lua`):
/// enough for a notification and an acquire round trip on a busy machine, short enough that a
/// notified waiter that vanished leaves the lock idle only briefly.
pub(crate) const RESERVATION_WINDOW: Duration = Duration::from_millis(10);

/// The reservation window in force: [`RESERVATION_WINDOW`], unless a test hook set another.
pub(crate) fn reservation_window(hooks: &crate::hooks::SharedHooks) -> Duration {
    match crate::hooks::read(hooks).reservation_window {
        Duration::ZERO => RESERVATION_WINDOW,
        set => set,
    }
}

/// What the release script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    Found(Ownership),
    /// Released, but the server refused the notification (the user may not publish).
    ReleasedUnannounced,
    /// Transferred to the call's successor, which holds it with this token.
    Transferred {
        fence: u64,
    },
    /// Handed over to another process's queued waiter, with the call's successor queued for it
    /// (at the back), for this grant time.
    Queued {
        grant: Duration,
    },
}

impl Node {
    /// `acquire.lua` for one lock: take it (or find it busy, mark it waited on and, where this
    /// node queues waiters, queue for it at `place`); the token is this server's, with its
    /// clock counted in steps of `clock_step_us` (1 for µs).
    ///
    /// # Cancel safety
    /// Not cancel safe: a request already sent may still take the lock.
    /// As [`acquire_many`](Self::acquire_many): a dropped call may hold the lock; the caller
    /// releases it with the same owner.
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        owner: &Owner,
        ttl: Duration,
        clock_step_us: u32,
        asker: Asker,
        place: Place,
    ) -> EngineResult<Acquired> {
        let item = LockCall {
            lock: names.lock.clone(),
            owner: owner.clone(),
            ttl,
            asker,
            ticket: match place {
                Place::At(ticket) => Some(ticket),
                _ => None,
            },
        };
        let grant_time = self.grant_time.filter(|_| place != Place::Unqueued);
        let mut answers = self
            .acquire_calls(std::slice::from_ref(&item), clock_step_us, grant_time)
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("acquire", "no answer"))?
    }

    /// `acquire.lua` for a batch of locks (already prefixed): one answer per lock. A lock whose
    /// key holds a value distlock did not write is answered with its own error; the others are
    /// unaffected.
    ///
    /// With [`ReplicaAck`], the script is followed by `WAIT` in the same round trip, and grants
    /// the replicas did not acknowledge are released again before the answer
    /// ([`Acquired::Unreplicated`]).
    ///
    /// # Cancel safety
    /// Not cancel safe: a request already sent may still take the locks.
    /// As [`invoke`](Self::invoke): a dropped call may have taken its locks; the callers release
    /// them with the owner tokens they keep (`acquire.rs`, `batches.rs`).
    pub(crate) async fn acquire_many(
        &self,
        items: &[LockCall],
        clock_step_us: u32,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        self.acquire_calls(items, clock_step_us, self.grant_time)
            .await
    }

    /// [`acquire_many`](Self::acquire_many), the waiters queued for `grant_time` (`None`: not
    /// queued): by `acquire.lua`, or for efficiency locks by a first try of `SET NX PX` where it
    /// may take the lock ([`efficiency`](super::efficiency)).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`acquire_many`](Self::acquire_many).
    async fn acquire_calls(
        &self,
        items: &[LockCall],
        clock_step_us: u32,
        grant_time: Option<Duration>,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        match self.fenced {
            true => {
                self.acquire_by_script(items, clock_step_us, grant_time)
                    .await
            }
            // Boxed: its claim and script calls would make every acquire's future larger.
            false => Box::pin(self.acquire_unfenced(items, grant_time)).await,
        }
    }

    /// `acquire.lua` for `items`, the waiters queued for `grant_time`; tokens 0 (efficiency
    /// locks) where the node's locks carry none.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`acquire_many`](Self::acquire_many).
    pub(super) async fn acquire_by_script(
        &self,
        items: &[LockCall],
        clock_step_us: u32,
        grant_time: Option<Duration>,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        let clock_step_us = if self.fenced { clock_step_us } else { 0 };
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        let step = Digits::of(u64::from(clock_step_us));
        let ttls: Vec<Digits> = items.iter().map(|item| Digits::ms(item.ttl)).collect();
        let askers: Vec<std::borrow::Cow<'_, [u8]>> = items
            .iter()
            .map(|item| match item.ticket {
                Some(ticket) if grant_time.is_some() => {
                    let code = char::from(asker_arg(item.asker));
                    format!("{code} {ticket}").into_bytes().into()
                }
                _ => asker_bytes(item.asker).into(),
            })
            .collect();
        let queue = self.queue_arg(grant_time);
        let mut args: Vec<&[u8]> = Vec::with_capacity(3 + 3 * items.len());
        args.push(step.as_bytes());
        args.push(&self.label);
        args.push(&queue);
        for ((item, ttl), asker) in items.iter().zip(&ttls).zip(&askers) {
            args.push(item.owner.as_bytes());
            args.push(ttl.as_bytes());
            args.push(asker);
        }
        let (reply, acknowledged): (Vec<i64>, _) = self
            .invoke_acked(&ACQUIRE, &keys, &args, self.replica_ack)
            .await?;
        if reply.len() != 2 * items.len() {
            return Err(unexpected("acquire", reply));
        }
        let answers: Vec<EngineResult<Acquired>> = reply
            .chunks_exact(2)
            .zip(items)
            .map(|(answer, item)| {
                let next = grant_time.map(|grant| grant_for(grant, item.ttl));
                let foreign = || diagnose::foreign_key(&item.lock);
                Acquire::decode(answer[0], answer[1])?.acquired(
                    next,
                    &item.lock,
                    LockKind::Exclusive,
                    foreign,
                )
            })
            .collect();
        match (self.replica_ack, acknowledged) {
            // Boxed: rare, and a future of a kilobyte that every acquire's would carry inline.
            (Some(ack), Some(acknowledged)) if acknowledged < ack.replicas => {
                Ok(Box::pin(self.take_back_unreplicated(items, answers, ack, acknowledged)).await)
            }
            _ => Ok(answers),
        }
    }

    /// Grants that fewer replicas than wanted acknowledged are released at once (a failover now
    /// could hand them to someone else) and answered [`Acquired::Unreplicated`]. A grant whose
    /// release fails is answered with that failure, ambiguous: the caller's cleanup releases it
    /// again with the same owner.
    ///
    /// # Cancel safety
    /// Not cancel safe: the grants may stay held.
    /// Dropped before the release answered, the grants may still be held: the caller's acquire
    /// is still in flight then (`acquire.rs`), and its cleanup releases them with the same owner.
    pub(super) async fn take_back_unreplicated(
        &self,
        items: &[LockCall],
        answers: Vec<EngineResult<Acquired>>,
        ack: ReplicaAck,
        acknowledged: u32,
    ) -> Vec<EngineResult<Acquired>> {
        let granted: Vec<ReleaseCall> = items
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| matches!(answer, Ok(Acquired::Yes { .. })))
            .map(|(item, _)| ReleaseCall::plain(item.lock.clone(), item.owner.clone()))
            .collect();
        if granted.is_empty() {
            return answers;
        }
        // The marker keeps the token granted (and taken back) as the one the next must exceed.
        let released = self
            .release_by_script(&granted, ack.marker_ttl, RESERVATION_WINDOW)
            .await;
        let unreplicated = Acquired::Unreplicated {
            acknowledged,
            wanted: ack.replicas,
            timeout: ack.timeout,
        };
        answers
            .into_iter()
            .map(|answer| match (answer, &released) {
                (Ok(Acquired::Yes { .. }), Ok(_)) => Ok(unreplicated),
                (Ok(Acquired::Yes { .. }), Err(failure)) => Err(EngineFailure {
                    ambiguous: true,
                    source: format!(
                        "{acknowledged} of {} replicas acknowledged the lock, and releasing it \
                         failed: {}",
                        ack.replicas, failure.source
                    )
                    .into(),
                }),
                (other, _) => other,
            })
            .collect()
    }

    /// `fence_writeback.lua`: record `fence` as the lock's token (and so, after the release, as
    /// the marker the next token must exceed) where `owner` still holds the lock. `true` when it
    /// did.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`invoke`](Self::invoke): a write-back already sent may still record `fence` where
    /// `owner` holds the lock; its acquire is still in flight then, and that acquire's cleanup
    /// releases with the same owner.
    pub(crate) async fn write_back_fence(
        &self,
        names: &KeyNames,
        owner: &Owner,
        fence: u64,
        kind: LockKind,
    ) -> EngineResult<bool> {
        let who = match kind.is_shared() {
            true => [&b"~"[..], &self.member(owner)].concat(),
            false => owner.as_bytes().to_vec(),
        };
        let done: i64 = self
            .invoke(
                &FENCE_WRITEBACK,
                &[&names.lock],
                &[&who, fence.to_string().as_bytes()],
            )
            .await?;
        Ok(FenceWriteback::decode(done)? == FenceWriteback::Recorded)
    }

    /// Releases one lock: free it if `owner` holds it, leaving its token as a marker for
    /// `marker_ttl`, and announce it if anyone waits ([`release_calls`](Self::release_calls)).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_calls`](Self::release_calls).
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        owner: &Owner,
        granted: GrantedAs,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = ReleaseCall {
            granted,
            ..ReleaseCall::plain(names.lock.clone(), owner.clone())
        };
        self.release_call(item, marker_ttl, reservation_window)
            .await
    }

    /// Gives `owner`'s vote back: releases the lock if `owner` holds it, and otherwise keeps
    /// `owner`'s place in the lock's queue, where it has one ([`release`](Self::release)
    /// gives the place up).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_calls`](Self::release_calls).
    pub(crate) async fn give_back(
        &self,
        names: &KeyNames,
        owner: &Owner,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = ReleaseCall {
            keeps_place: true,
            ..ReleaseCall::plain(names.lock.clone(), owner.clone())
        };
        self.release_call(item, marker_ttl, reservation_window)
            .await
    }

    /// Releases `owner`'s lock and transfers it to `successor` in the same script unless
    /// others wait for it (`release.lua`).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_by_script`](Self::release_by_script): dropped after sending, the lock may
    /// be transferred all the same; asked again, a transfer that ran answers again.
    pub(crate) async fn transfer(
        &self,
        names: &KeyNames,
        owner: &Owner,
        successor: &Successor,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = ReleaseCall {
            successor: Some(successor.clone()),
            ..ReleaseCall::plain(names.lock.clone(), owner.clone())
        };
        self.release_call(item, marker_ttl, reservation_window)
            .await
    }

    /// [`release_calls`](Self::release_calls) for one lock: its answer.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_calls`](Self::release_calls).
    async fn release_call(
        &self,
        item: ReleaseCall,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let mut answers = self
            .release_calls(std::slice::from_ref(&item), marker_ttl, reservation_window)
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("release", "no answer"))
    }

    /// Releases a batch of exclusive locks (already prefixed), one answer each, in one round trip
    /// where it can: the locks granted quietly with one conditional `SET … IFEQ` each where the
    /// server has it ([`conditional`]), the others by `release.lua` in the same pipeline. A
    /// conditional write that does not find the lock as granted (waited on, expired, taken over)
    /// is followed by `release.lua` for that lock, which notifies its waiters and tells which.
    ///
    /// # Cancel safety
    /// Not cancel safe: a release already sent may still run.
    /// As [`invoke`](Self::invoke): dropped after sending, some locks may be released; the
    /// caller finishes the release in the background (`release.rs`), where a lock already
    /// released reads as gone.
    pub(crate) async fn release_calls(
        &self,
        items: &[ReleaseCall],
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let (quiet, scripted) = self.quiet_and_scripted(items);
        if quiet.is_empty() {
            return self
                .release_by_script(items, marker_ttl, reservation_window)
                .await;
        }
        if !self.fenced {
            let batch = Pipelined {
                items,
                quiet: &quiet,
                scripted: &scripted,
            };
            // Boxed: its two calls at once would make every release's future larger.
            let unfenced = Box::pin(self.release_unfenced(batch, marker_ttl, reservation_window));
            return unfenced.await;
        }
        let bound = self.connection().await?;
        if !bound.conditional_set.usable() {
            return self
                .release_by_script(items, marker_ttl, reservation_window)
                .await;
        }
        let pipelined = Pipelined {
            items,
            quiet: &quiet,
            scripted: &scripted,
        };
        let answers = self
            .release_pipelined(&bound, pipelined, marker_ttl, reservation_window)
            .await?;
        self.release_the_rest(items, answers, marker_ttl, reservation_window)
            .await
    }

    /// By index: the locks a conditional write may release, with their tokens, and the rest.
    fn quiet_and_scripted(&self, items: &[ReleaseCall]) -> (Vec<(usize, u64)>, Vec<usize>) {
        let (mut quiet, mut scripted) = (Vec::new(), Vec::new());
        for (index, item) in items.iter().enumerate() {
            match item.granted {
                GrantedAs::Quietly { fence }
                    if item.successor.is_none() && !self.contended.contains(&item.lock) =>
                {
                    quiet.push((index, fence));
                }
                _ => scripted.push(index),
            }
        }
        (quiet, scripted)
    }

    /// One pipeline: a conditional `SET … IFEQ` per quiet lock, then `release.lua` for the
    /// scripted ones. An answer per lock, `None` where the lock is left for `release.lua` alone
    /// (a conditional write that did not find it as granted; a script that failed).
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_calls`](Self::release_calls).
    async fn release_pipelined(
        &self,
        bound: &Bound,
        batch: Pipelined<'_>,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<Vec<Option<ReleaseReply>>> {
        let Pipelined {
            items,
            quiet,
            scripted,
        } = batch;
        let mut pipe = redis::pipe();
        for (index, fence) in quiet {
            let item = &items[*index];
            pipe.add_command(conditional::release_command(
                &item.lock,
                *fence,
                &item.owner,
                &self.label,
                marker_ttl,
            ));
        }
        let (marker_ms, window) = (self.marker_arg(marker_ttl), Digits::ms(reservation_window));
        if !scripted.is_empty() {
            let keys: Vec<&str> = scripted.iter().map(|i| items[*i].lock.as_str()).collect();
            let owners: Vec<_> = scripted
                .iter()
                .map(|i| items[*i].script_arg(self.grant_time))
                .collect();
            let args = self.release_args(&owners, marker_ms.as_bytes(), window.as_bytes());
            pipe.add_command(RELEASE.evalsha(&keys, &args));
        }
        let mut conn = bound.conn.clone();
        let replies: Vec<Value> =
            pipe.ignore_errors()
                .query_async(&mut conn)
                .await
                .map_err(|err| {
                    self.after_failure(bound, &err);
                    self.failure(err)
                })?;
        if replies.len() != quiet.len() + usize::from(!scripted.is_empty()) {
            return Err(unexpected("release", replies));
        }
        let mut answers: Vec<Option<ReleaseReply>> = vec![None; items.len()];
        let mut replies = replies.into_iter();
        for ((index, _), reply) in quiet.iter().zip(replies.by_ref()) {
            match conditional::outcome(&reply, &bound.conditional_set) {
                conditional::Outcome::Released => {
                    answers[*index] = Some(ReleaseReply::Found(Ownership::Ours));
                }
                conditional::Outcome::NotAsGranted => self.contended.note(&items[*index].lock),
                _ => {}
            }
        }
        // The script's answer; an error (NOSCRIPT on first use, say) leaves its locks to
        // `release_the_rest`.
        let codes = replies
            .next()
            .and_then(|reply| reply.extract_error().ok())
            .and_then(|reply| Vec::<Value>::from_redis_value(reply).ok());
        if let Some(codes) = codes {
            let calls = scripted.iter().map(|i| &items[*i]);
            if let Ok(released) = release_replies(codes, calls, self.grant_time) {
                for (index, answer) in scripted.iter().zip(released) {
                    answers[*index] = Some(answer);
                }
            }
        }
        Ok(answers)
    }

    /// Sends the locks the pipeline left unanswered to `release.lua`; every lock's answer.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_calls`](Self::release_calls).
    pub(super) async fn release_the_rest(
        &self,
        items: &[ReleaseCall],
        mut answers: Vec<Option<ReleaseReply>>,
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let released_already = answers.iter().any(Option::is_some);
        let rest: Vec<usize> = (0..items.len()).filter(|i| answers[*i].is_none()).collect();
        if !rest.is_empty() {
            let pending: Vec<ReleaseCall> = rest.iter().map(|i| items[*i].clone()).collect();
            let again = self
                .release_by_script(&pending, marker_ttl, reservation_window)
                .await
                .map_err(|mut failure| {
                    // The batch's other locks were released: to their callers the failure must
                    // read as "may have run", so that a retry finding them gone counts as done.
                    failure.ambiguous |= released_already;
                    failure
                })?;
            for (index, answer) in rest.into_iter().zip(again) {
                answers[index] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.ok_or_else(|| unexpected("release", "no answer")))
            .collect()
    }

    /// `acquire.lua`'s grant time of queued waiters: `0` (waiters do not queue), or the
    /// milliseconds followed by this process's handover channel, if it has a usable one.
    fn queue_arg(&self, grant_time: Option<Duration>) -> Vec<u8> {
        let Some(grant) = grant_time else {
            return b"0".to_vec();
        };
        let mut arg = ms_arg(grant);
        if let Some(channel) = self.usable_handover_channel() {
            arg.push(b' ');
            arg.extend_from_slice(channel.as_bytes());
        }
        arg
    }

    fn usable_handover_channel(&self) -> Option<&str> {
        self.handover_channel
            .as_deref()
            .and_then(HandoverChannel::usable)
    }

    /// `release.lua`'s marker TTL: `marker_ttl`, or 0 where locks carry no token (a release
    /// then deletes the key).
    fn marker_arg(&self, marker_ttl: Duration) -> Digits {
        match self.fenced {
            true => Digits::ms(marker_ttl),
            false => Digits::of(0),
        }
    }

    /// `release.lua`'s arguments for locks whose per-lock arguments are `owners`
    /// ([`ReleaseCall::script_arg`]).
    fn release_args<'a>(
        &'a self,
        owners: &'a [std::borrow::Cow<'a, [u8]>],
        marker_ms: &'a [u8],
        window: &'a [u8],
    ) -> Vec<&'a [u8]> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(5 + owners.len());
        args.push(marker_ms);
        args.push(window);
        args.push(self.publish.as_bytes());
        args.push(self.usable_handover_channel().unwrap_or("").as_bytes());
        args.push(if self.hands_over { b"1" } else { b"0" });
        args.extend(owners.iter().map(|owner| &**owner));
        args
    }

    /// `release.lua` for every one of `items` (locks already prefixed): one answer each. A lock
    /// that was waited on is left to the waiters it notifies for `reservation_window`; one that was
    /// not, and names a successor, is transferred to it.
    ///
    /// # Cancel safety
    /// Not cancel safe: a release already sent may still run.
    /// As [`invoke`](Self::invoke): dropped after sending, the locks may be released (or
    /// transferred) all the same; callers that must know release again with the same owners,
    /// where a lock already released reads as gone and a transfer that ran answers again.
    pub(crate) async fn release_by_script(
        &self,
        items: &[ReleaseCall],
        marker_ttl: Duration,
        reservation_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        let owners: Vec<_> = items
            .iter()
            .map(|item| item.script_arg(self.grant_time))
            .collect();
        let (marker_ms, window) = (self.marker_arg(marker_ttl), Digits::ms(reservation_window));
        let args = self.release_args(&owners, marker_ms.as_bytes(), window.as_bytes());
        let codes: Vec<Value> = self.invoke(&RELEASE, &keys, &args).await?;
        release_replies(codes, items.iter(), self.grant_time)
    }
}

/// What a release found, for one server's engine: a release the server could not announce is
/// reported (once per engine) and counts as done.
pub(crate) fn settle_release(
    reply: ReleaseReply,
    reported: &AtomicBool,
    prefix: &str,
    lock: &str,
) -> Ownership {
    match reply {
        ReleaseReply::Found(ownership) => ownership,
        ReleaseReply::ReleasedUnannounced => {
            report_refused_publish(reported, prefix, &crate::lock::key::channel_of(lock));
            Ownership::Ours
        }
        // Only a call naming a successor is transferred or queued: ours until then.
        ReleaseReply::Transferred { .. } | ReleaseReply::Queued { .. } => Ownership::Ours,
    }
}

/// What a release naming a successor did, for one server's engine ([`settle_release`] when it
/// was not transferred).
pub(crate) fn settle_transfer(
    reply: ReleaseReply,
    reported: &AtomicBool,
    prefix: &str,
    lock: &str,
) -> Transfer {
    match reply {
        ReleaseReply::Transferred { fence } => Transfer::Granted { fence },
        ReleaseReply::Queued { grant } => Transfer::Queued { grant },
        reply => Transfer::Released(settle_release(reply, reported, prefix, lock)),
    }
}

/// The release script could not announce a release: say so, once per engine, loudly — the
/// release itself stands.
pub(crate) fn report_refused_publish(reported: &AtomicBool, prefix: &str, channel: &str) {
    if reported.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        target: "distlock::release",
        channel,
        prefix,
        "the server refused to publish a release notification (the Redis user may not \
         publish on the channel); releases still happen, but waiters in other processes learn \
         of them only by backoff. Grant the rules distlock::redis::acl_rules(prefix) returns"
    );
}

/// `release.lua`'s answer for the locks of `calls`: a code each (`6`: handed over, the
/// successor queued with its grant time out of `grant_time`), or `{5, fence}` for a transfer.
fn release_replies<'a>(
    codes: Vec<Value>,
    calls: impl ExactSizeIterator<Item = &'a ReleaseCall>,
    grant_time: Option<Duration>,
) -> EngineResult<Vec<ReleaseReply>> {
    if codes.len() != calls.len() {
        return Err(unexpected("release", codes));
    }
    codes
        .into_iter()
        .zip(calls)
        .map(|(code, call)| {
            let answer = match code {
                Value::Int(code) => Release::decode(code, None),
                Value::Array(ref pair) => match pair.as_slice() {
                    [Value::Int(code), Value::Int(token)] => Release::decode(*code, Some(*token)),
                    _ => Err(UnknownReply::new(Release::SCRIPT, &code)),
                },
                ref other => Err(UnknownReply::new(Release::SCRIPT, other)),
            }?;
            Ok(match answer {
                Release::Released | Release::HandedOver => ReleaseReply::Found(Ownership::Ours),
                Release::ReleasedUnannounced => ReleaseReply::ReleasedUnannounced,
                Release::Expired => ReleaseReply::Found(Ownership::Gone),
                Release::TakenOver => ReleaseReply::Found(Ownership::TakenOver),
                Release::Transferred { token } => ReleaseReply::Transferred { fence: token },
                Release::HandedOverSuccessorQueued => match (&call.successor, grant_time) {
                    (Some(successor), Some(grant)) => ReleaseReply::Queued {
                        grant: grant_for(grant, successor.ttl),
                    },
                    // Only a release that named a successor can have queued it.
                    _ => return Err(UnknownReply::new(Release::SCRIPT, 6).into()),
                },
            })
        })
        .collect()
}

/// A batch of releases as [`Node::release_calls`] splits it: by index, the locks a
/// conditional write (or, for efficiency locks, `delete_if.lua`) may release, with their
/// tokens, and those `release.lua` releases.
#[derive(Clone, Copy)]
pub(super) struct Pipelined<'a> {
    pub(super) items: &'a [ReleaseCall],
    pub(super) quiet: &'a [(usize, u64)],
    pub(super) scripted: &'a [usize],
}
