//! Redlock (redis.io: *Distributed Locks with Redis*) over N masters, with what it leaves open:
//! fencing tokens that stay monotonic across different quorums, votes released at once after a
//! failed attempt, and renewal and release by quorum.
//!
//! - **Acquire**: one owner token, the acquire script on every master in parallel (each bounded
//!   by the per-master timeout). Each master that grants returns its *vote*: its own
//!   `max(marker + 1, server µs)` (or, for an owner it already granted, the token recorded for
//!   it; the marker is the token a release left, see `acquire.lua`). With a quorum (N/2 + 1) of
//!   votes the token is `T`, the largest vote of a quorum `S` of them (the Q lowest), and it is
//!   written back — the lock's token set to `T`, which its release leaves as the marker, only
//!   where the lock is still ours — on every granting master; `T` is
//!   handed out only once a quorum confirmed the write-back and the attempt took less than the
//!   lease's validity (TTL − drift). Votes count the clock in milliseconds, so masters whose
//!   clocks and markers agree vote the same `T`; when every granting master voted `T` or more,
//!   their locks hold it already and the write-back is skipped. Anything less and the attempt's
//!   votes are released on every
//!   master at once, so contenders that split the votes do not stall each other for a TTL.
//! - **Why tokens stay monotonic**: a token `T` handed out was recorded on a quorum `W` while
//!   our lock held each of those masters. A later grant takes its token as the largest vote of a
//!   quorum `S'`, which shares a master `m` with `W`; its vote at `m` was taken after our lock
//!   left `m` — a master holds one lock per key at a time, and ours was alive there at the
//!   write-back — so after the write-back, and that vote is at least `T + 1` (our release left
//!   `T` as the marker; had our lock expired there instead, `m`'s clock moved on by the TTL, which
//!   is enough while the masters' clocks agree within the TTL); so is the later token. The same argument, with `S` against every earlier `W`, shows `T` exceeds every
//!   earlier token. It holds while fewer than a quorum of masters are faulty in all (down when a
//!   token is granted, or losing their markers afterwards): the write-back reaches every
//!   master that granted, so a later quorum still meets one that remembers. Limit: a master
//!   that loses its data (restarted without persistence) within a lease breaks Redlock's
//!   exclusion itself; restart masters no sooner than the longest TTL after they stopped (the
//!   delayed restarts of redis.io's *Distributed Locks with Redis*).
//! - **Renewal**: every master in parallel, one script call per master per batch; a lease's
//!   validity advances only when a quorum confirmed it, and it is lost as soon as enough masters
//!   say "gone" or "another owner" that a quorum can no longer confirm it.
//! - **Release**: to all N masters, also those that did not answer the acquire.
//! - **Notifications**: a subscription on every master, into one table; a waiter counts as
//!   subscribed once N − Q + 1 masters confirmed, so every quorum a releasing holder had
//!   includes a master that tells it.

mod fan_out;
mod operator;
mod permits;

pub(crate) use fan_out::quorum;

use crate::engines::engine::{
    Acquired, Asker, Engine, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal,
};
use crate::engines::redis::node::{
    report_refused_publish, Node, Place, ReleaseReply, RESERVATION_WINDOW,
};
use crate::engines::redis::pubsub::Subscriber;
use crate::engines::settings::{Timeouts, TlsFiles};
use crate::error::LockError;
use crate::hooks::SharedHooks;
use crate::lock::key::KeyNames;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::lock::policy::valid_for;
use crate::operating::doctor::{Check, Finding};
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::wait::{Channels, OnIdleHook, ReleaseWatch};
use fan_out::{all, fan_out, summarize, Answers};
use futures_util::future::BoxFuture;
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Votes count the masters' clocks in milliseconds: masters whose clocks agree to the
/// millisecond (and whose markers agree) vote the same token, and a token a quorum already
/// holds needs no write-back — the common case costs the round trips of a single server.
const CLOCK_STEP_US: u32 = 1000;

/// Where the masters are and how to talk to them.
pub(crate) struct RedlockConfig<'a> {
    pub(crate) urls: &'a [String],
    pub(crate) prefix: &'a str,
    pub(crate) marker_ttl: Duration,
    pub(crate) timeouts: Timeouts,
    /// How long one master may take to answer before its vote counts as refused.
    pub(crate) master_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) tls: &'a TlsFiles,
    pub(crate) hooks: SharedHooks,
    /// Written with every lock, for operators.
    pub(crate) holder_label: &'a str,
    /// How long a waiter keeps its place in a master's queue between its asks
    /// ([`handover_grant`](crate::lock::policy::handover_grant)).
    pub(crate) grant_time: Duration,
}

struct Master {
    node: Arc<Node>,
    subscriber: Arc<Subscriber>,
    /// `host:port`, for messages.
    address: String,
}

pub(crate) struct RedlockEngine {
    masters: Vec<Master>,
    quorum: usize,
    channels: Arc<Channels>,
    prefix: String,
    marker_ttl: Duration,
    master_timeout: Duration,
    drift_factor: f64,
    publish_refused: AtomicBool,
    /// The slot each permit holder holds (`permits.rs`), by owner token.
    permit_slots: std::sync::Mutex<HashMap<String, u32>>,
    /// By owner token, the masters that hold exactly the value of the grant (their vote was the
    /// token, or the write-back recorded it): where a conditional release can hit. Taken at the
    /// release; bounded, since it only saves round trips.
    granted_as: std::sync::Mutex<HashMap<String, Vec<bool>>>,
    /// By owner token, a waiting caller's place in line on every master's queue (µs of this
    /// process's clock when it first queued) and when it last asked: every master orders the
    /// waiters alike, by ticket, so their queues agree on who is first.
    tickets: std::sync::Mutex<HashMap<String, (u64, Instant)>>,
    /// How long a place in a master's queue lasts between asks.
    grant_time: Duration,
}

/// Grants remembered in [`RedlockEngine::granted_as`] at most; past it the memory starts over.
const GRANTS_REMEMBERED: usize = 65_536;

impl RedlockEngine {
    pub(crate) fn open(config: RedlockConfig<'_>) -> Result<Self, LockError> {
        let count = config.urls.len();
        let quorum = quorum(count);
        let channels = Arc::new(Channels::needing(count - quorum + 1));
        let mut masters = Vec::with_capacity(count);
        for url in config.urls {
            let node = Arc::new(
                Node::open(url, config.tls, config.timeouts, config.prefix)?
                    .with_label(config.holder_label)
                    // Waiters queue on every master, which grants a free lock only to the
                    // first of them; a release tells them, and the first asks (a handover
                    // would be one master's decision).
                    .with_queue(config.grant_time, false),
            );
            let subscriber = Subscriber::new(
                node.clone(),
                config.timeouts,
                config.prefix,
                config.hooks.clone(),
                channels.clone(),
            );
            let address = node.address();
            masters.push(Master {
                node,
                subscriber,
                address,
            });
        }
        Ok(RedlockEngine {
            masters,
            quorum,
            channels,
            prefix: config.prefix.to_owned(),
            marker_ttl: config.marker_ttl,
            master_timeout: config.master_timeout,
            drift_factor: config.drift_factor,
            publish_refused: AtomicBool::new(false),
            permit_slots: std::sync::Mutex::default(),
            granted_as: std::sync::Mutex::default(),
            tickets: std::sync::Mutex::default(),
            grant_time: config.grant_time,
        })
    }

    fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.prefix, key)
    }

    /// A master listed twice (by `host:port`), if any.
    pub(crate) fn duplicate_master(&self) -> Option<&str> {
        let mut seen = std::collections::HashSet::new();
        self.masters
            .iter()
            .map(|master| master.address.as_str())
            .find(|address| !seen.insert(*address))
    }

    /// How many "not ours" answers make a quorum of "ours" impossible.
    fn blocking(&self) -> usize {
        self.masters.len() - self.quorum + 1
    }

    /// `owner`'s place in line on the masters' queues, for an ask at `now`: the ticket it
    /// queued with, unless its places may have lapsed since (it did not ask for two thirds of
    /// the grant time: a process that was paused, say), when it goes to the back with a new
    /// one.
    fn ticket(&self, owner: &Owner, now: Instant) -> u64 {
        let mut tickets = self.tickets.lock().unwrap_or_else(|e| e.into_inner());
        if tickets.len() >= GRANTS_REMEMBERED {
            tickets.clear();
        }
        let fresh = || {
            let since_epoch = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
            since_epoch.as_micros() as u64
        };
        let place = tickets
            .entry(owner.as_str().to_owned())
            .or_insert_with(|| (fresh(), now));
        if now.duration_since(place.1) > self.grant_time * 2 / 3 {
            place.0 = fresh();
        }
        place.1 = now;
        place.0
    }

    /// Forgets `owner`'s place in line: its call holds the lock, or ended.
    fn forget_ticket(&self, owner: &Owner) {
        self.tickets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(owner.as_str());
    }

    /// One acquire attempt on every master: an exclusive lock (or, with `queue` false, a
    /// permit's slot, whose waiters do not queue: they try every slot), or a reader.
    ///
    /// # Cancel safety
    /// Not cancel safe: votes already sent may still take the lock.
    /// Dropped mid-way, votes (and write-backs) already sent may still take the lock on some
    /// masters, and nothing is recorded in `granted_as`; the caller's acquire is in flight then,
    /// and its cleanup releases on every master with the same owner.
    async fn attempt(
        &self,
        names: &KeyNames,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
        queue: bool,
    ) -> Attempt {
        let started = Instant::now();
        let place = match (queue, asker) {
            (false, _) | (_, Asker::Once) => Place::Unqueued,
            (true, _) => Place::At(self.ticket(owner, started)),
        };
        let vote = Vote {
            names,
            owner,
            ttl,
            asker,
            kind,
            place,
        };
        let votes = self.count(self.vote(vote).await);
        if votes.granted.len() < self.quorum {
            return if votes.busy.is_empty() {
                let failures = votes.failures;
                Attempt::Failed(summarize(
                    "acquire",
                    failures,
                    self.masters.len(),
                    self.quorum,
                ))
            } else {
                // Another owner holds (or is taking) votes, or is first in line: a busy lock, or
                // split votes.
                Attempt::Busy {
                    ttl: votes.busy.into_iter().flatten().max(),
                    refused: votes.refused,
                    queued: votes.queued,
                }
            };
        }
        // The token is the largest vote of a quorum — the Q lowest votes: a retry by the same
        // owner, whose masters return the token recorded on at least a quorum of them, reads
        // that token again, whatever the other masters hold.
        let mut tokens: Vec<u64> = votes.granted.iter().map(|(_, vote)| *vote).collect();
        tokens.sort_unstable();
        // A reader's token is the largest its masters know — at least every writer token a
        // quorum recorded (its quorum meets each) — and is written back, so every later writer's
        // quorum meets a master that knows it.
        let token = match kind {
            LockKind::Read => *tokens.last().expect("a quorum voted"),
            _ => tokens[self.quorum - 1],
        };
        let (exact, confirmed) = self.record(vote, &votes.granted, token).await;
        let validity = valid_for(ttl, self.drift_factor);
        let elapsed = started.elapsed();
        if confirmed < self.quorum {
            return Attempt::Busy {
                ttl: None,
                refused: vec![false; self.masters.len()],
                queued: None,
            };
        }
        if elapsed >= validity {
            return Attempt::Failed(EngineFailure {
                ambiguous: false,
                source: format!(
                    "acquiring took {elapsed:?}, longer than the lease's validity of {validity:?}; \
                     the masters are too slow for this TTL"
                )
                .into(),
            });
        }
        Attempt::Granted { token, exact }
    }

    /// Asks every master for its vote.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`attempt`](Self::attempt).
    async fn vote(&self, vote: Vote<'_>) -> Answers<Acquired> {
        // Every vote is waited for (within the timeout) unless enough refused that no quorum
        // can grant: stopping at the first quorum would let a retry by the same owner read a
        // different quorum of its recorded tokens, and a vote landing late keep its own.
        let hopeless = |votes: &Answers<Acquired>| {
            let refused = votes
                .iter()
                .filter(|vote| {
                    matches!(
                        vote,
                        Some(Ok(Acquired::Busy { .. } | Acquired::Unreplicated { .. }) | Err(_))
                    )
                })
                .count();
            refused >= self.blocking()
        };
        let Vote {
            names,
            owner,
            ttl,
            asker,
            kind,
            place,
        } = vote;
        fan_out(
            &self.masters,
            self.master_timeout,
            |master| -> BoxFuture<'_, EngineResult<Acquired>> {
                match kind {
                    LockKind::Read => {
                        Box::pin(
                            master
                                .node
                                .acquire_shared(&names.lock, owner, ttl, asker, kind),
                        )
                    }
                    _ => Box::pin(master.node.acquire(
                        names,
                        owner,
                        ttl,
                        CLOCK_STEP_US,
                        asker,
                        place,
                    )),
                }
            },
            hopeless,
        )
        .await
    }

    /// The votes, sorted by what they say.
    fn count(&self, answers: Answers<Acquired>) -> Votes {
        let mut votes = Votes {
            granted: Vec::new(),
            busy: Vec::new(),
            refused: vec![false; self.masters.len()],
            queued: None,
            failures: Vec::new(),
        };
        for (index, vote) in answers.into_iter().enumerate() {
            match vote {
                Some(Ok(Acquired::Yes { fence })) => votes.granted.push((index, fence)),
                Some(Ok(Acquired::Busy { ttl, next, .. })) => {
                    votes.busy.push(ttl);
                    votes.refused[index] = true;
                    votes.queued = votes.queued.or(next);
                }
                // Masters are independent: none is set to wait for replicas (the builder
                // refuses it), so this vote never comes; it would count as no vote.
                Some(Ok(Acquired::Unreplicated { .. })) => {}
                Some(Err(failure)) => {
                    let address = self.masters[index].address.clone();
                    votes.failures.push((address, failure));
                }
                None => {}
            }
        }
        votes
    }

    /// Makes sure the granting masters record `token`: per master, whether it holds exactly
    /// the grant's value, and how many granting masters record the token.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`attempt`](Self::attempt).
    async fn record(
        &self,
        vote: Vote<'_>,
        granted: &[(usize, u64)],
        token: u64,
    ) -> (Vec<bool>, usize) {
        // A master that voted `T` or more records at least `T` as its token already: when every
        // granting master did, the write-back would change nothing, and every granting
        // master remembers `T` — as many as a write-back would reach.
        let mut exact = vec![false; self.masters.len()];
        if granted.iter().all(|(_, voted)| *voted >= token) {
            for (index, voted) in granted {
                exact[*index] = *voted == token;
            }
            return (exact, granted.len());
        }
        let confirmations = |recorded: &Answers<bool>| {
            recorded
                .iter()
                .filter(|answer| matches!(answer, Some(Ok(true))))
                .count()
        };
        let recorded = fan_out(
            granted.iter().map(|(index, _)| &self.masters[*index]),
            self.master_timeout,
            |master| {
                master
                    .node
                    .write_back_fence(vote.names, vote.owner, token, vote.kind)
            },
            |recorded| confirmations(recorded) >= self.quorum,
        )
        .await;
        for ((index, _), answer) in granted.iter().zip(&recorded) {
            exact[*index] = matches!(answer, Some(Ok(true)));
        }
        (exact, confirmations(&recorded))
    }

    /// Releases `owner`'s lock (or votes) on every master, and waits for every answer (within
    /// the per-master timeout): a release not yet sent when its future is dropped — one still
    /// loading its script after NOSCRIPT, say — would leave a copy until its TTL.
    ///
    /// A lock granted quietly is released with a conditional write on the masters that hold
    /// exactly the granted value (their vote was the token, or the write-back recorded it), where
    /// the server has one; the other masters run the script at once.
    ///
    /// # Cancel safety
    /// Not cancel safe: releases already sent still run, the others are not sent.
    /// The grant's `granted_as` entry is taken before the first await. Dropped, the releases
    /// already sent still run and the others are not sent; the caller releases again with the same
    /// owner, by script on every master.
    async fn release_everywhere(
        &self,
        names: &KeyNames,
        owner: &Owner,
        kind: LockKind,
        granted: GrantedAs,
    ) -> Answers<ReleaseReply> {
        let everywhere = vec![true; self.masters.len()];
        self.release_where(names, owner, kind, granted, &everywhere)
            .await
    }

    /// [`release_everywhere`](Self::release_everywhere) on the masters `on` marks.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_everywhere`](Self::release_everywhere).
    async fn release_where(
        &self,
        names: &KeyNames,
        owner: &Owner,
        kind: LockKind,
        granted: GrantedAs,
        on: &[bool],
    ) -> Answers<ReleaseReply> {
        let exact = self
            .granted_as
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(owner.as_str());
        // Per master: what its copy of the lock was granted as.
        let targets: Vec<(&Master, GrantedAs)> = self
            .masters
            .iter()
            .enumerate()
            .filter(|(index, _)| on[*index])
            .map(|(index, master)| match (&exact, granted) {
                (Some(exact), GrantedAs::Quietly { .. }) if exact[index] => (master, granted),
                _ => (master, GrantedAs::Unknown),
            })
            .collect();
        fan_out(
            &targets,
            self.master_timeout,
            |(master, granted)| -> BoxFuture<'_, EngineResult<ReleaseReply>> {
                match kind {
                    LockKind::Read => Box::pin(master.node.release_shared(
                        &names.lock,
                        owner,
                        self.marker_ttl,
                        RESERVATION_WINDOW,
                    )),
                    _ => Box::pin(master.node.release(
                        names,
                        owner,
                        *granted,
                        self.marker_ttl,
                        RESERVATION_WINDOW,
                    )),
                }
            },
            all,
        )
        .await
    }

    /// Per lease of a renewal batch: how many masters said ours, gone, another owner's.
    fn tally(
        &self,
        leases: usize,
        answers: &Answers<Vec<Option<Ownership>>>,
    ) -> Vec<(usize, usize, usize)> {
        let mut tallies = vec![(0, 0, 0); leases];
        for ownerships in answers.iter().flatten().flatten() {
            for (tally, ownership) in tallies.iter_mut().zip(ownerships) {
                match ownership {
                    Some(Ownership::Ours) => tally.0 += 1,
                    Some(Ownership::Gone) => tally.1 += 1,
                    Some(Ownership::TakenOver) => tally.2 += 1,
                    None => {}
                }
            }
        }
        tallies
    }

    /// A lease's renewal, decided: ours with a quorum, lost once a quorum became impossible,
    /// undecided otherwise.
    fn verdict(&self, (ours, gone, taken_over): (usize, usize, usize)) -> Option<Ownership> {
        if ours >= self.quorum {
            Some(Ownership::Ours)
        } else if gone + taken_over >= self.blocking() {
            Some(if taken_over > 0 {
                Ownership::TakenOver
            } else {
                Ownership::Gone
            })
        } else {
            None
        }
    }

    fn on_idle(&self) -> OnIdleHook {
        let hooks: Vec<OnIdleHook> = self
            .masters
            .iter()
            .map(|master| master.subscriber.on_idle())
            .collect();
        Arc::new(move |channel: String| {
            for hook in &hooks {
                hook(channel.clone());
            }
        })
    }
}

/// One acquire attempt's outcome.
enum Attempt {
    /// A quorum granted and recorded this token.
    Granted {
        token: u64,
        /// Per master: holds exactly the value of the grant.
        exact: Vec<bool>,
    },
    /// Another owner holds votes, or is first in line for them.
    Busy {
        /// The holder's longest remaining TTL, when known.
        ttl: Option<Duration>,
        /// Per master: it refused the vote, so it holds nothing of this owner's.
        refused: Vec<bool>,
        /// Some master queued the caller, for this grant time.
        queued: Option<Duration>,
    },
    /// Too many masters failed (or were too slow) for a quorum.
    Failed(EngineFailure),
}

/// What one attempt asks every master.
#[derive(Clone, Copy)]
struct Vote<'a> {
    names: &'a KeyNames,
    owner: &'a Owner,
    ttl: Duration,
    asker: Asker,
    kind: LockKind,
    place: Place,
}

/// The masters' votes, sorted.
struct Votes {
    /// The masters that granted, with their votes (tokens).
    granted: Vec<(usize, u64)>,
    /// The holder's remaining TTL each refusing master gave.
    busy: Vec<Option<Duration>>,
    /// Per master: it refused.
    refused: Vec<bool>,
    /// Some master queued the caller, for this grant time.
    queued: Option<Duration>,
    /// The masters that failed, by address.
    failures: Vec<(String, EngineFailure)>,
}

impl RedlockEngine {
    /// An exclusive lock (or a permit's slot) or a reader on the lock `names`, by quorum.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`attempt`](Self::attempt), also while a failed attempt's votes are given back: the
    /// caller's acquire is still in flight, and its cleanup releases on every master.
    pub(super) async fn acquire_names(
        &self,
        names: &KeyNames,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
        queue: bool,
    ) -> EngineResult<Acquired> {
        match self.attempt(names, owner, ttl, asker, kind, queue).await {
            Attempt::Granted { token, exact } => {
                self.forget_ticket(owner);
                if kind == LockKind::Exclusive {
                    let mut granted = self.granted_as.lock().unwrap_or_else(|e| e.into_inner());
                    if granted.len() >= GRANTS_REMEMBERED {
                        granted.clear();
                    }
                    granted.insert(owner.as_str().to_owned(), exact);
                }
                Ok(Acquired::Yes { fence: token })
            }
            Attempt::Busy {
                ttl,
                refused,
                queued,
            } => {
                // Give every vote back at once, so a split vote costs the contenders one round
                // trip, not a TTL — on the masters that granted or did not answer: the others
                // hold nothing of ours, and keep this caller's place in their queues.
                let granted_or_unknown: Vec<bool> =
                    refused.iter().map(|refused| !refused).collect();
                if granted_or_unknown.contains(&true) {
                    self.give_back(names, owner, kind, &granted_or_unknown)
                        .await;
                }
                Ok(match queued {
                    Some(place) => Acquired::queued(ttl, place, false),
                    None => Acquired::busy(ttl),
                })
            }
            Attempt::Failed(failure) => {
                // Too few masters answered: the caller keeps its places (and its ticket) for
                // its next try, which masters that come back see in the same order.
                let everywhere = vec![true; self.masters.len()];
                self.give_back(names, owner, kind, &everywhere).await;
                Err(failure)
            }
        }
    }

    /// Gives a failed attempt's votes back on the masters `on` marks: an exclusive lock (or
    /// slot) `owner` holds there is released, and `owner` keeps its place in their queues (the
    /// attempt's ask may have queued it where it did not answer); a reader's hold is released.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_everywhere`](Self::release_everywhere).
    async fn give_back(&self, names: &KeyNames, owner: &Owner, kind: LockKind, on: &[bool]) {
        if kind == LockKind::Read {
            self.release_where(names, owner, kind, GrantedAs::Unknown, on)
                .await;
            return;
        }
        let targets: Vec<&Master> = self
            .masters
            .iter()
            .zip(on)
            .filter_map(|(master, on)| on.then_some(master))
            .collect();
        fan_out(
            targets,
            self.master_timeout,
            |master| {
                master
                    .node
                    .give_back(names, owner, self.marker_ttl, RESERVATION_WINDOW)
            },
            all,
        )
        .await;
    }

    /// Releases `owner`'s hold of the lock `names` on every master, judged by quorum.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`release_everywhere`](Self::release_everywhere).
    pub(super) async fn release_names(
        &self,
        names: &KeyNames,
        owner: &Owner,
        kind: LockKind,
        granted: GrantedAs,
    ) -> EngineResult<Ownership> {
        self.forget_ticket(owner);
        let answers = self.release_everywhere(names, owner, kind, granted).await;
        let (mut ours, mut gone, mut taken_over) = (0, 0, 0);
        let mut failures = Vec::new();
        for (index, answer) in answers.into_iter().enumerate() {
            match answer {
                // Redlock names no successor, so no master transfers.
                Some(Ok(
                    ReleaseReply::Found(Ownership::Ours)
                    | ReleaseReply::Transferred { .. }
                    | ReleaseReply::Queued { .. },
                )) => ours += 1,
                Some(Ok(ReleaseReply::ReleasedUnannounced)) => {
                    report_refused_publish(&self.publish_refused, &self.prefix, &names.channel);
                    ours += 1;
                }
                Some(Ok(ReleaseReply::Found(Ownership::Gone))) => gone += 1,
                Some(Ok(ReleaseReply::Found(Ownership::TakenOver))) => taken_over += 1,
                Some(Err(failure)) => failures.push((self.masters[index].address.clone(), failure)),
                None => {}
            }
        }
        // Judged as the lock is judged, by quorum: ours if a quorum still held it (a stale
        // copy on a minority does not make an expired lock ours), counting the masters that
        // did not answer as possibly ours. A master that could not be reached keeps its copy
        // until its TTL; a minority cannot grant anyone.
        if ours >= self.quorum || (ours > 0 && ours + failures.len() >= self.quorum) {
            return Ok(Ownership::Ours);
        }
        if taken_over >= self.quorum {
            return Ok(Ownership::TakenOver);
        }
        if ours + gone + taken_over >= self.quorum {
            return Ok(Ownership::Gone);
        }
        Err(summarize(
            "release",
            failures,
            self.masters.len(),
            self.quorum,
        ))
    }

    /// Renews a batch whose locks (`locks[i]` for `batch[i]`) are already named, on every
    /// master; a lease's renewal decided by quorum.
    ///
    /// # Cancel safety
    /// Cancel safe: no lease relies on a renewal that was not confirmed.
    /// Dropped only with the watchdog's renewal: renewals already sent may still extend the copies
    /// on their masters; a lease counts only a confirmed quorum, so it never relies on them.
    async fn renew_locks(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
    ) -> EngineResult<Vec<Option<Ownership>>> {
        let answers = fan_out(
            &self.masters,
            self.master_timeout,
            |master| master.node.renew(locks, batch),
            // Every master's renewal is waited for (within the per-master timeout), not only a
            // quorum's: a renewal dropped once a quorum answered may never be sent (a master
            // that is reconnecting, or loading the script), and its copy would expire — one
            // master fewer between the lease and its loss. Only a lease already lost ends the
            // wait early.
            |answers| {
                self.tally(batch.len(), answers).iter().any(|tally| {
                    matches!(
                        self.verdict(*tally),
                        Some(Ownership::Gone | Ownership::TakenOver)
                    )
                })
            },
        )
        .await;
        let tallies = self.tally(batch.len(), &answers);
        let failures: Vec<(String, EngineFailure)> = answers
            .into_iter()
            .enumerate()
            .filter_map(|(index, answer)| match answer {
                Some(Err(failure)) => Some((self.masters[index].address.clone(), failure)),
                _ => None,
            })
            .collect();
        if failures.len() == self.masters.len() {
            return Err(summarize(
                "renew",
                failures,
                self.masters.len(),
                self.quorum,
            ));
        }
        Ok(tallies
            .into_iter()
            .map(|tally| self.verdict(tally))
            .collect())
    }
}

impl Engine for RedlockEngine {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>> {
        Box::pin(async move {
            if let LockKind::Permits(permits) = kind {
                return self.acquire_permit(key, owner, ttl, asker, permits).await;
            }
            self.acquire_names(&self.names(key), owner, ttl, asker, kind, true)
                .await
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>> {
        Box::pin(async move {
            if let LockKind::Permits(permits) = kind {
                return self.release_permit(key, owner, permits).await;
            }
            self.release_names(&self.names(key), owner, kind, granted)
                .await
        })
    }

    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>> {
        Box::pin(async move {
            let (locks, batch) = self.renewal_targets(batch);
            let batch: Vec<Renewal<'_>> = batch
                .iter()
                .map(|(key, renewal)| Renewal { key, ..*renewal })
                .collect();
            self.renew_locks(&locks, &batch).await
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(async move {
            let names = self.names(key);
            let answers = fan_out(
                &self.masters,
                self.master_timeout,
                |master| master.node.inspect(&names),
                all,
            )
            .await;
            let mut by_owner: HashMap<String, Vec<Holder>> = HashMap::new();
            let mut failures = Vec::new();
            let mut answered = 0;
            for (index, answer) in answers.into_iter().enumerate() {
                match answer {
                    Some(Ok(holder)) => {
                        answered += 1;
                        if let Some(holder) = holder {
                            by_owner
                                .entry(holder.owner.clone())
                                .or_default()
                                .push(holder);
                        }
                    }
                    Some(Err(failure)) => {
                        failures.push((self.masters[index].address.clone(), failure))
                    }
                    None => {}
                }
            }
            let held = by_owner
                .into_values()
                .find(|copies| copies.len() >= self.quorum);
            let Some(mut copies) = held else {
                if answered < self.quorum {
                    return Err(summarize(
                        "inspect",
                        failures,
                        self.masters.len(),
                        self.quorum,
                    ));
                }
                return Ok(None);
            };
            // The lock lives as long as a quorum of its copies: the quorum-th longest TTL. Its
            // token is the one recorded on a quorum: the quorum-th lowest (a vote that landed
            // late on another master may be higher).
            copies.sort_by_key(|copy| std::cmp::Reverse(copy.ttl));
            let ttl = copies[self.quorum - 1].ttl;
            let mut tokens: Vec<u64> = copies.iter().map(|copy| copy.fencing_token).collect();
            tokens.sort_unstable();
            let fencing_token = tokens[self.quorum - 1];
            // A waiting process subscribes on every master: the most any master counts.
            let waiting = copies.iter().filter_map(|copy| copy.waiting).max();
            // Readers each hold a quorum of masters, not all the same: the most any master
            // counts.
            let shared = copies.iter().filter_map(|copy| copy.shared).max();
            // An exclusive lock's release announces itself on every master it was marked on,
            // and waiters listen on all: one mark is enough. A writer's intent holds new readers
            // back only once a quorum carries it (a reader needs a quorum free of it).
            let marked = copies.iter().filter(|copy| copy.waited_on).count();
            let waited_on = match shared {
                None => marked > 0,
                Some(_) => marked >= self.quorum,
            };
            let first = copies.swap_remove(0);
            Ok(Some(Holder {
                owner: first.owner,
                fencing_token,
                ttl,
                label: first.label,
                waited_on,
                waiting,
                shared,
            }))
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>> {
        Box::pin(async move {
            let channel = self.names(key).channel;
            let watch = self.channels.register(&channel, Some(self.on_idle()));
            let confirmations = fan_out(
                &self.masters,
                self.master_timeout,
                |master| master.subscriber.subscribe_and_confirm(&channel),
                all,
            )
            .await;
            // A refused subscription (NOPERM) is a configuration error, not a slow master.
            if let Some(Some(Err(refused))) = confirmations
                .into_iter()
                .find(|answer| matches!(answer, Some(Err(failure)) if !failure.ambiguous))
            {
                return Err(refused);
            }
            Ok(watch)
        })
    }

    fn rights(&self) -> BoxFuture<'_, Vec<Finding>> {
        let checks = self.masters.iter().map(|master| async move {
            let found = master.node.check_acl().await;
            found.into_iter().map(|finding| Finding {
                check: finding.check,
                advice: format!("master {}: {}", master.address, finding.advice),
            })
        });
        Box::pin(async move {
            futures_util::future::join_all(checks)
                .await
                .into_iter()
                .flatten()
                .collect()
        })
    }

    fn close_links(&self) -> BoxFuture<'_, ()> {
        let links = self.masters.iter().map(|master| master.subscriber.close());
        Box::pin(async move {
            futures_util::future::join_all(links).await;
        })
    }

    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<Finding>>> {
        Box::pin(async move {
            let reports = fan_out(
                &self.masters,
                self.master_timeout * 20,
                |master| master.node.doctor(),
                all,
            )
            .await;
            let mut findings = Vec::new();
            for (master, report) in self.masters.iter().zip(reports) {
                match report.expect("every master is waited for") {
                    Ok(found) => findings.extend(found.into_iter().map(|finding| Finding {
                        check: finding.check,
                        advice: format!("master {}: {}", master.address, finding.advice),
                    })),
                    Err(failure) => findings.push(Finding {
                        check: Check::Unreachable,
                        advice: format!(
                            "master {} did not answer ({}); with fewer than {} of {} masters \
                             up, no lock can be taken",
                            master.address,
                            failure.source,
                            self.quorum,
                            self.masters.len()
                        ),
                    }),
                }
            }
            Ok(findings)
        })
    }

    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>> {
        Box::pin(self.list_keys(pattern))
    }

    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>> {
        Box::pin(self.force_unlock_all(key))
    }

    fn follow<'a>(
        &'a self,
        key: &'a str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>> {
        Box::pin(self.follow_all(key, notifications, events))
    }
}

/// What this engine shows the test suite (`SharedHooks::show`).
#[cfg(distlock_test_hooks)]
impl RedlockEngine {
    pub(crate) fn watched_channels(&self) -> u64 {
        self.channels.watched() as u64
    }
}
