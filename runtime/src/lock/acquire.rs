//! Acquiring one key: take the process-local turn, then contend on the server — one round trip
//! when the lock is free, release notifications plus jittered backoff while it is busy, and
//! same-owner retries when a reply is lost. A turn may come with the lock already granted: the
//! previous local holder's release transferred it (a local transfer: the release script grants
//! the lock to the owner token this task pledged, in the same round trip; see `release.rs`), and
//! the task holds it without asking the server; or with a place in the lock's queue (that
//! release handed the lock to another process), and the task waits for its handover first.

use crate::backend::handle::BackendInner;
use crate::backend::Backend;
use crate::engines::engine::{Acquired, Asker, EngineFailure};
use crate::error::LockError;
use crate::error::Operation;
use crate::hooks::{self, TestHooks};
use crate::lock::kind::{LockKind, WRITER_RETRY};
use crate::lock::lease::{HeldLease, Terms};
use crate::lock::owner::Owner;
use crate::lock::policy::MAX_FAILED_ATTEMPTS;
use crate::lock::release::release_in_background;
use crate::operating::metrics::{Labels, Waiting};
use crate::operating::stats::Stats;
use crate::wait::{Backoff, Claimed, ReleaseWatch, Turn};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::Instrument;

/// One key's acquisition, with the settings shared by all keys of one lock.
pub(crate) struct Request<'a> {
    pub(crate) backend: &'a Backend,
    pub(crate) terms: Terms,
    pub(crate) started: Instant,
    /// End of the wait budget; `None` waits forever.
    pub(crate) deadline: Option<Instant>,
    pub(crate) labels: &'a Labels,
}

impl Request<'_> {
    /// Acquires `key`. The returned lease keeps the key's local turn until it is released, so
    /// the next local waiter contends only after the release (or is transferred the lock by
    /// it). A task queued behind the turn may get the lock with the turn, without a request of
    /// its own.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping this future at any point leaves nothing held for longer than one round trip:
    /// queued behind a local turn, it leaves the queue (a turn handed to it in that instant is
    /// passed on, and a lock transferred with it released in the background); holding the
    /// turn, it passes the turn on;
    /// with an acquire request in flight (or one whose reply was lost), it releases that
    /// request's possible lock in the background with its owner token, and passes the turn on
    /// once the server has seen the release.
    pub(crate) async fn acquire(&self, key: String) -> Result<Arc<HeldLease>, LockError> {
        let span = tracing::info_span!(
            "distlock.acquire",
            key = %key,
            attempts = tracing::field::Empty,
            waited_us = tracing::field::Empty,
        );
        async {
            let mut waiting_gauge = Waiting::new(self.labels);
            // Readers and permit holders do not queue behind each other in this process: each
            // contends on its own (the server counts them). Writers take the key's local turn.
            let turn = if self.terms.kind.is_shared() {
                None
            } else {
                let gates = &self.backend.inner.gates;
                let enter = gates.enter(&key, self.deadline, self.terms.ttl);
                let Some(mut turn) = waiting_gauge.unless_ready(enter).await else {
                    return Err(self.busy(key, None));
                };
                match turn.take_transferred() {
                    // The previous holder's release transferred the lock to this task.
                    Some(Claimed::Lock {
                        owner,
                        fence,
                        since,
                        run_started,
                    }) => {
                        let lease = self.transferred(key, owner, fence, since, run_started, turn);
                        return Ok(lease);
                    }
                    // It handed the lock to another process, and made this task the next
                    // waiter after it: this task waits for the handover, without asking first.
                    Some(Claimed::Place {
                        owner,
                        since,
                        grant,
                    }) => {
                        let mut attempt = Attempt::new(self, key, owner, Some(turn), waiting_gauge);
                        attempt.next = Some((since, grant));
                        return self.contend(attempt, Some((since, grant))).await;
                    }
                    None => {}
                }
                Some(turn)
            };
            let attempt = Attempt::new(self, key, Owner::random(), turn, waiting_gauge);
            self.contend(attempt, None).await
        }
        .instrument(span)
        .await
    }

    /// The lease of a lock a local transfer granted to this task with `fence`, valid from
    /// `since` (when the transfer was sent), held with the owner token the task pledged, in the
    /// run of this process's holders in a row that began at `run_started`.
    fn transferred(
        &self,
        key: String,
        owner: Owner,
        fence: u64,
        since: Instant,
        run_started: Instant,
        turn: Turn,
    ) -> Arc<HeldLease> {
        let stats = &self.backend.inner.stats;
        Stats::bump(&stats.acquired);
        Stats::bump(&stats.transferred);
        let mut lease = HeldLease::new(
            stats.clone(),
            self.labels.clone(),
            key,
            owner,
            fence,
            &self.terms,
            since,
        );
        lease.run_started = run_started;
        lease.keep_turn(turn);
        Arc::new(lease)
    }

    /// What is left of the wait budget (`None`: waiting forever).
    fn remaining(&self) -> Option<Duration> {
        self.deadline
            .map(|deadline| deadline.saturating_duration_since(Instant::now()))
    }

    /// The call's end with the lock busy; `retry_after` as the server said at the last try.
    fn busy(&self, key: String, retry_after: Option<Duration>) -> LockError {
        Stats::bump(&self.backend.inner.stats.busy);
        LockError::Busy {
            key,
            // A single try did not wait (its round trip is not waiting).
            waited: match self.deadline {
                Some(deadline) if deadline <= self.started => Duration::ZERO,
                _ => self.started.elapsed(),
            },
            retry_after,
        }
    }

    /// Contends for the key on the server until it is acquired, the wait budget is spent or a
    /// failure ends the call. `placed`: the attempt is queued for the lock already (made so
    /// by a request sent at that instant, for that grant time), and waits before it asks.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future drops `attempt`: with a request in flight, a reply lost, or its place
    /// in the lock's queue recorded, it releases in the background, with its owner token,
    /// whatever that request may have taken or been handed over (and gives the place up);
    /// otherwise nothing is held and the turn passes on at once. A waiting writer's intent left
    /// on the server lapses within `WRITER_INTENT` (500 ms).
    async fn contend(
        &self,
        mut attempt: Attempt<'_>,
        mut placed: Option<(Instant, Duration)>,
    ) -> Result<Arc<HeldLease>, LockError> {
        let stats = &self.backend.inner.stats;
        // A caller with no wait budget tries once; one that waits becomes `Waiting` at its first
        // busy reply, and a lock released to notified waiters is then its as much as theirs.
        let asked_at_once = placed.is_none();
        let mut state = Contention {
            waiting: None,
            attempts: 0,
            failed_in_a_row: 0,
            subscribed_since_last_wait: false,
            asker: match self.remaining() {
                Some(Duration::ZERO) => Asker::Once,
                _ => Asker::WillWait,
            },
        };
        loop {
            // Before the request: its reply may queue this attempt, and the
            // handover's message can overtake that reply (another connection).
            attempt.expect_handover();
            let asked = placed.is_none();
            // A waiter of a backend shutting down stops (dropping `attempt` gives up its place).
            self.backend.refuse_when_closing()?;
            let (outcome, sent_at) = match placed.take() {
                // Queued already: as if the server had just said so.
                Some((since, grant)) => (Ok(Acquired::queued(None, grant, false)), since),
                None => self.ask(&mut attempt, &mut state).await,
            };
            let span = tracing::Span::current();
            span.record("attempts", state.attempts);
            span.record("waited_us", self.started.elapsed().as_micros() as u64);
            match outcome {
                Ok(Acquired::Yes { fence }) => {
                    Stats::bump(&stats.acquired);
                    // A first try's grant, unless this attempt was queued before it asked.
                    let first_try = state.attempts == 1 && asked_at_once;
                    return Ok(attempt.claim(self, fence, sent_at, first_try));
                }
                Ok(Acquired::Unreplicated {
                    acknowledged,
                    wanted,
                    timeout,
                }) => {
                    // The engine released the grant already: a failover could hand it on.
                    return Err(LockError::ReplicasNotAcknowledged {
                        key: attempt.key.clone(),
                        acknowledged,
                        wanted,
                        timeout,
                    });
                }
                Ok(Acquired::Busy {
                    ttl,
                    reserved,
                    next,
                    anew,
                }) => {
                    if asked {
                        Stats::bump(&stats.busy_replies);
                    }
                    let busy = Busy {
                        holder_ttl: ttl,
                        reserved,
                        next,
                        anew,
                        sent_at,
                    };
                    if let Some(lease) = self.on_busy(&mut attempt, &mut state, busy).await? {
                        return Ok(lease);
                    }
                }
                Err(failure) => self.on_failure(&mut attempt, &mut state, failure).await?,
            }
        }
    }

    /// Sends one acquire request: its outcome and when it was sent.
    ///
    /// # Cancel safety
    /// Not cancel safe on its own: the request may still take the lock.
    /// Dropping the future leaves `attempt.in_flight` set: the attempt, dropped with it,
    /// releases in the background whatever the request may have taken.
    async fn ask(
        &self,
        attempt: &mut Attempt<'_>,
        state: &mut Contention,
    ) -> (Result<Acquired, EngineFailure>, Instant) {
        state.attempts += 1;
        let sent_at = Instant::now();
        attempt.in_flight = true;
        let outcome = self
            .backend
            .inner
            .engine
            .acquire(
                &attempt.key,
                &attempt.owner,
                self.terms.ttl,
                state.asker,
                self.terms.kind,
            )
            .await;
        #[cfg(distlock_test_hooks)]
        let outcome = self.test_hooks_on_reply(outcome).await;
        attempt.in_flight = false;
        (outcome, sent_at)
    }

    /// The test hooks' say on an acquire's reply: held back a while, or lost.
    ///
    /// # Cancel safety
    /// Cancel safe: dropped, the reply is dropped with it, as in [`ask`](Self::ask), whose
    /// attempt still counts its request as in flight.
    #[cfg(distlock_test_hooks)]
    async fn test_hooks_on_reply(
        &self,
        outcome: Result<Acquired, EngineFailure>,
    ) -> Result<Acquired, EngineFailure> {
        let test_hooks = &self.backend.inner.hooks;
        let delay = hooks::read(test_hooks).acquire_reply_delay;
        if !delay.is_zero() {
            hooks::set(test_hooks, |hooks| hooks.acquire_replies_held += 1);
            hooks::local_changed();
            tokio::time::sleep(delay).await;
        }
        let anew = matches!(outcome, Ok(Acquired::Busy { anew: true, .. }));
        if anew && hooks::read(test_hooks).lose_anew_acquire_reply {
            hooks::set(test_hooks, |hooks| hooks.lose_anew_acquire_reply = false);
            hooks::local_changed();
            return Err(EngineFailure::ambiguous("test hook: the reply was lost"));
        }
        outcome
    }

    /// After a busy reply: waits for a release, a handover or the time to ask again.
    /// `Ok(Some)`: the lock was handed over meanwhile; `Ok(None)`: ask again.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future while it subscribes or waits drops nothing the caller holds: the
    /// attempt, dropped with it, gives up whatever place and handover it has (see `contend`).
    async fn on_busy(
        &self,
        attempt: &mut Attempt<'_>,
        state: &mut Contention,
        busy: Busy,
    ) -> Result<Option<Arc<HeldLease>>, LockError> {
        if busy.anew && attempt.next.is_some() {
            // Queued before, and the place is gone: a handover made to it lapsed
            // unclaimed (or it lapsed itself), and a message of it that comes late
            // would be trusted from this request's send time, which may be after
            // the handover. Handovers are confirmed by asking from now on.
            attempt.distrusts_handovers = true;
        }
        if let Some(grant) = busy.next {
            // Queued: a release hands the lock over to this attempt when its turn comes.
            attempt.next = Some((busy.sent_at, grant));
        }
        state.asker = Asker::Waiting;
        state.failed_in_a_row = 0;
        let remaining = self.remaining();
        if remaining == Some(Duration::ZERO) {
            return Err(self.busy(attempt.key.clone(), busy.holder_ttl));
        }
        attempt.waiting_gauge.start();
        let inner = &self.backend.inner;
        state.waiting.get_or_insert_with(|| start_waiting(inner));
        // A reserved lock is not re-checked after subscribing: that would take it from the
        // waiters it is reserved for. A release that slips by before the subscription (a
        // notified waiter's short hold) costs at most the rest of the reservation, when this
        // caller looks again.
        if self.subscribe(attempt, state).await? && !busy.reserved {
            return Ok(None);
        }
        // An unconfirmed subscription (the server did not answer) is retried once
        // per backoff period, never in a tight loop.
        state.subscribed_since_last_wait = false;
        let watch = attempt.watch_slot().as_ref().expect("subscribed above");
        let confirmed = watch.is_confirmed();
        let delay = self.wait_time(attempt, state, &busy, remaining, confirmed);
        let watch = attempt.watch_slot().as_mut().expect("subscribed above");
        tokio::select! {
            () = watch.released() => {}
            () = tokio::time::sleep(delay) => {}
        }
        if let Some(fence) = attempt.handed_over_fence() {
            if let Some(lease) = attempt.take_handover(self, fence) {
                Stats::bump(&inner.stats.acquired);
                Stats::bump(&inner.stats.handed_over);
                return Ok(Some(lease));
            }
            // Too late to rely on: asking again confirms it (the lock is ours).
        }
        Ok(None)
    }

    /// Subscribes to the key's releases unless a confirmed subscription exists or one was made
    /// since the last wait; `true` when it subscribed now (and the caller checks again: a
    /// release between the busy reply and the subscription is caught by that re-check).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future drops the subscription being made; the attempt keeps the one it had.
    async fn subscribe(
        &self,
        attempt: &mut Attempt<'_>,
        state: &mut Contention,
    ) -> Result<bool, LockError> {
        let confirmed = attempt
            .watch_slot()
            .as_ref()
            .is_some_and(|watch| watch.is_confirmed());
        if confirmed || state.subscribed_since_last_wait {
            return Ok(false);
        }
        let delay = state
            .waiting
            .as_ref()
            .map(|(_, hooks)| hooks.subscribe_delay);
        if let Some(delay) = delay.filter(|delay| !delay.is_zero()) {
            tokio::time::sleep(delay).await;
        }
        // The new watch is registered before the old one, if any, is dropped.
        let watch = self
            .backend
            .inner
            .engine
            .watch(&attempt.key)
            .await
            .map_err(|failure| self.backend.backend_error(Operation::Subscribe, failure))?;
        *attempt.watch_slot() = Some(watch);
        // A reserved lock is waited for without another request first.
        attempt.expect_handover();
        state.subscribed_since_last_wait = true;
        Ok(true)
    }

    /// How long a busy attempt waits before it asks again, unless a release or a handover
    /// wakes it first.
    fn wait_time(
        &self,
        attempt: &Attempt<'_>,
        state: &mut Contention,
        busy: &Busy,
        remaining: Option<Duration>,
        confirmed: bool,
    ) -> Duration {
        let (backoff, _) = state.waiting.as_mut().expect("made before the first wait");
        // A lock left to the waiters a release notified is theirs until the
        // reservation ends: wait exactly that long (or for a notification), not a
        // jittered backoff, whose short sleeps would let this caller — a waiter from
        // now on — take it from them.
        let delay = match (busy.reserved, busy.holder_ttl, attempt.next) {
            (true, Some(left), _) => remaining.map_or(left, |budget| left.min(budget)),
            // Queued: the release's message (or notification) is what wakes it; it
            // asks again only to keep its place, or when the lock may be free. Without
            // notifications in force (a subscription not answered yet, or a server that
            // cannot send them now) it polls too, but never past its place's keeping.
            (false, _, Some((_, grant))) => {
                let keep = keep_place(grant, busy.holder_ttl, remaining);
                if confirmed {
                    keep
                } else {
                    keep.min(backoff.next_delay(remaining, busy.holder_ttl))
                }
            }
            _ => backoff.next_delay(remaining, busy.holder_ttl),
        };
        // A waiting writer renews its intent (new readers queue behind it) at each
        // try: it tries again before the intent lapses, whatever `max_backoff` says.
        match self.terms.kind {
            LockKind::Exclusive if self.backend.inner.engine.writer_intent_lapses() => {
                delay.min(WRITER_RETRY)
            }
            _ => delay,
        }
    }

    /// After a failed round trip: `Ok` to ask again (at once, or after a backoff), `Err` when
    /// the wait budget is spent.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future during its backoff drops the attempt with it (see `contend`).
    async fn on_failure(
        &self,
        attempt: &mut Attempt<'_>,
        state: &mut Contention,
        failure: EngineFailure,
    ) -> Result<(), LockError> {
        state.failed_in_a_row += 1;
        attempt.reply_lost |= failure.ambiguous;
        if failure.ambiguous && attempt.next.is_some() {
            // A queued attempt cannot tell whether the request whose reply was lost found its
            // place gone and queued it anew: the next reply ("queued, the place kept") would
            // hide that, and a handover message of the lapsed place would be trusted from that
            // reply's send time. Handovers are confirmed by asking from now on (found by the
            // model checker, tests/model).
            attempt.distrusts_handovers = true;
        }
        tracing::debug!(
            target: "distlock::acquire",
            attempt = state.attempts,
            ambiguous = failure.ambiguous,
            error = %failure.source,
            "acquire round trip failed"
        );
        // A lost reply is retried at once with the same owner — it costs a round
        // trip, never a wait or a second token — up to MAX_FAILED_ATTEMPTS in a row,
        // even past the wait budget. Beyond that, failures (a server down, a quorum
        // lost for a moment) are retried after a backoff while the wait budget
        // lasts, and the call ends with the error when it is spent.
        if failure.ambiguous && state.failed_in_a_row < MAX_FAILED_ATTEMPTS {
            return Ok(());
        }
        let remaining = self.remaining();
        if remaining == Some(Duration::ZERO) {
            // Dropping `attempt` releases whatever a lost reply may have taken.
            return Err(self.backend.backend_error(Operation::Acquire, failure));
        }
        attempt.waiting_gauge.start();
        let inner = &self.backend.inner;
        let (backoff, _) = state.waiting.get_or_insert_with(|| start_waiting(inner));
        tokio::time::sleep(backoff.next_delay(remaining, None)).await;
        Ok(())
    }
}

/// The state of one call's contention for a key, across its requests.
struct Contention {
    /// Made on the first busy reply or failure.
    waiting: Option<(Backoff, TestHooks)>,
    /// Requests sent.
    attempts: u32,
    /// Failed round trips since the last reply.
    failed_in_a_row: u32,
    subscribed_since_last_wait: bool,
    /// Who the next request says asks.
    asker: Asker,
}

/// A busy reply, as `contend` handles it.
struct Busy {
    /// How long the holder keeps the lock (or a reservation lasts), when the server said.
    holder_ttl: Option<Duration>,
    /// Left to the waiters a release notified.
    reserved: bool,
    /// Queued, with this grant time.
    next: Option<Duration>,
    /// Queued with a new place.
    anew: bool,
    /// When the request was sent.
    sent_at: Instant,
}

/// A handover is taken as it comes only with at least this much of its grant time left: enough
/// for the watchdog's confirmation to come back before it runs out.
pub(crate) const HANDOVER_MARGIN: Duration = Duration::from_millis(50);

/// How long a queued waiter waits before it asks again, unless woken: a third of its grant time,
/// so that its place (which lapses a grant time after its last ask) is kept with two asks to
/// spare; at most until the holder's lease ends (+1 ms), when the lock may be free and the
/// first waiter must take it by asking, and never past the wait budget.
pub(crate) fn keep_place(
    grant: Duration,
    holder_ttl: Option<Duration>,
    remaining: Option<Duration>,
) -> Duration {
    let mut delay = grant / 3;
    if let Some(ttl) = holder_ttl {
        delay = delay.min(ttl + Duration::from_millis(1));
    }
    remaining.map_or(delay, |budget| delay.min(budget))
}

/// What waiting needs, made on the first wait: an uncontended acquire never reads the test hooks.
fn start_waiting(inner: &BackendInner) -> (Backoff, TestHooks) {
    let hooks = hooks::read(&inner.hooks);
    let backoff = Backoff::new(inner.settings.max_backoff).with_floor(hooks.backoff_floor);
    (backoff, hooks)
}

/// One key's acquisition in progress: the owner token its requests carry, the key's local turn,
/// and the task's place in the waiting-tasks gauge (left when this is claimed or dropped). Until
/// a lease owns them, dropping it — a cancelled call, a returned error — releases in the
/// background whatever a request in flight or a lost reply may have taken on the server; without
/// such a request, it just passes the turn on.
struct Attempt<'a> {
    backend: &'a Backend,
    labels: &'a Labels,
    key: String,
    owner: Owner,
    /// The key's local turn (writers; readers and permits take none).
    turn: Option<Turn>,
    /// The release subscription of an attempt without a turn (a turn carries its own).
    own_watch: Option<ReleaseWatch>,
    /// An acquire request is on its way; its outcome is unknown until the reply arrives.
    in_flight: bool,
    /// A reply was lost: that request may have taken the lock (sticky: a request on a broken
    /// connection can still run after a later reply said "busy").
    reply_lost: bool,
    /// The server queued this attempt for the lock: the send time of the last request it
    /// said so to, and how long a handover is held before it is confirmed (sticky: the
    /// server may hand the lock over at any moment until it is told otherwise).
    next: Option<(Instant, Duration)>,
    /// This attempt lost a place it had in the queue: a handover message is not taken as it
    /// comes (it may be of the lapsed handover), only confirmed by asking.
    distrusts_handovers: bool,
    waiting_gauge: Waiting<'a>,
    kind: LockKind,
    /// The TTL each acquire request asks for.
    ttl: Duration,
}

impl<'a> Attempt<'a> {
    /// Where this attempt keeps the key's release subscription: in its turn, handed on with
    /// it, or its own.
    fn watch_slot(&mut self) -> &mut Option<ReleaseWatch> {
        match &mut self.turn {
            Some(turn) => &mut turn.watch,
            None => &mut self.own_watch,
        }
    }

    /// Tells the key's release subscription, if there is one, that a handover to this attempt
    /// may come: it is kept (and wakes the watch) even if its message arrives before the reply
    /// that queued this attempt. Only a writer holding the key's local turn is ever handed a
    /// lock (readers and permits never queue, and must not take
    /// the expectation from the process's writer).
    fn expect_handover(&self) {
        if let Some(watch) = self.turn_watch() {
            watch.expect_handover(self.owner.as_str());
        }
    }

    /// The fencing token of a handover to this attempt that came since it was expected, taken.
    fn handed_over_fence(&self) -> Option<u64> {
        self.turn_watch()?.take_handover(self.owner.as_str())
    }

    /// The release subscription of the key's local turn, if this attempt holds the turn and the
    /// turn has one.
    fn turn_watch(&self) -> Option<&ReleaseWatch> {
        self.turn.as_ref()?.watch.as_ref()
    }

    fn new(
        request: &Request<'a>,
        key: String,
        owner: Owner,
        turn: Option<Turn>,
        waiting_gauge: Waiting<'a>,
    ) -> Self {
        Attempt {
            backend: request.backend,
            labels: request.labels,
            key,
            owner,
            turn,
            own_watch: None,
            kind: request.terms.kind,
            ttl: request.terms.ttl,
            in_flight: false,
            reply_lost: false,
            next: None,
            distrusts_handovers: false,
            waiting_gauge,
        }
    }

    /// The lock is ours: hands the owner token and the turn to a lease, which releases them
    /// from now on.
    fn claim(
        mut self,
        request: &Request<'_>,
        fence: u64,
        sent_at: Instant,
        first_try: bool,
    ) -> Arc<HeldLease> {
        let mut lease = self.hand_to_lease(request, fence, sent_at);
        lease.first_try = first_try;
        Arc::new(lease)
    }

    /// The lease of a lock this attempt holds with `fence`, valid from `since`: the owner token
    /// and the turn move to it, and the attempt is disarmed (the lease releases from now on).
    fn hand_to_lease(&mut self, request: &Request<'_>, fence: u64, since: Instant) -> HeldLease {
        let lease = HeldLease::new(
            self.backend.inner.stats.clone(),
            self.labels.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
            fence,
            &request.terms,
            since,
        );
        if let Some(turn) = self.turn.take() {
            lease.keep_turn(turn);
        }
        self.reply_lost = false;
        self.next = None;
        lease
    }

    /// The previous holder's release handed the lock over to this attempt, with `fence`: a
    /// lease valid for the handover's grant time from the last request that queued this
    /// attempt (the handover came after the server answered it), which the watchdog
    /// confirms within the first third of it. `None` when that leaves too little to rely on,
    /// where the engine's grants must be acknowledged by replicas, or once the attempt lost a
    /// place it had (the caller then asks for the lock again, which confirms it the ordinary
    /// way).
    fn take_handover(&mut self, request: &Request<'_>, fence: u64) -> Option<Arc<HeldLease>> {
        if self.distrusts_handovers || self.backend.inner.engine.handovers_need_asking() {
            return None;
        }
        let (since, grant) = self.next?;
        let valid_for = crate::lock::policy::valid_for(grant, request.terms.drift_factor);
        if Instant::now() + HANDOVER_MARGIN >= since + valid_for {
            return None;
        }
        let mut lease = self.hand_to_lease(request, fence, since);
        lease.handed_over(since, grant, request.terms.drift_factor);
        Some(Arc::new(lease))
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        if !(self.in_flight || self.reply_lost || self.next.is_some()) {
            return; // Nothing may be held (or a lease owns it): the turn passes on as it drops.
        }
        // The release (`release.lua`) also ends this attempt's place in the lock's queue,
        // or releases the lock if it was handed over meanwhile.
        let lease = HeldLease::unconfirmed(
            self.backend.inner.stats.clone(),
            self.labels.clone(),
            std::mem::take(&mut self.key),
            std::mem::take(&mut self.owner),
            self.kind,
            self.ttl,
            self.turn.take(),
        );
        release_in_background(self.backend.clone(), [Arc::new(lease)].into(), true);
    }
}
