//! A held lock: owner token, fencing token, local validity and the lost flag.

use crate::engines::engine::GrantedAs;
use crate::error::{LockError, LostReason};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::lock::policy::valid_for;
use crate::operating::metrics::{self, Labels};
use crate::operating::stats::Stats;
use crate::wait::{Successor, Transferred, Turn};
use once_cell::sync::Lazy;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// All monotonic instants of a lease are stored as nanoseconds since this base, so they fit in
/// an atomic.
static CLOCK_BASE: Lazy<Instant> = Lazy::new(Instant::now);

pub(crate) fn to_nanos(at: Instant) -> u64 {
    at.saturating_duration_since(*CLOCK_BASE).as_nanos() as u64
}

pub(crate) fn from_nanos(nanos: u64) -> Instant {
    *CLOCK_BASE + Duration::from_nanos(nanos)
}

/// How a lease is granted: the same for every key of one lock.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    pub(crate) ttl: Duration,
    /// Fraction of the TTL taken off for clock drift.
    pub(crate) drift_factor: f64,
    /// Renewed by the watchdog (`lease = "watchdog"`), or fixed.
    pub(crate) renewing: bool,
    /// `max_hold`: the watchdog renews only until this long after the request.
    pub(crate) max_hold: Option<Duration>,
    /// Exclusive, a reader, or a permit.
    pub(crate) kind: LockKind,
}

/// One key held by one call.
///
/// Validity is local and monotonic: `valid_until = start of the request + ttl − drift`, moved
/// forward only by confirmed renewals, measured from when the renewal was *sent*. Past it the lease
/// is lost even if no reply ever came back, so a process that was paused wakes up knowing.
pub(crate) struct HeldLease {
    /// The backend's counters (lost leases are counted).
    stats: Arc<Stats>,
    /// The lock's metrics labels (lost leases, renewals and releases are counted per key).
    pub(crate) labels: Labels,
    pub(crate) key: String,
    pub(crate) owner: Owner,
    pub(crate) fence: u64,
    pub(crate) ttl: Duration,
    /// Exclusive, a reader, or a permit: how it is renewed and released.
    pub(crate) kind: LockKind,
    /// `ttl` less the drift margin: how long a grant or renewal stays valid after it was sent.
    valid_for: Duration,
    /// Renewed by the watchdog (`lease = "watchdog"`), or fixed.
    pub(crate) renewing: bool,
    /// `max_hold`: the watchdog renews only until this instant.
    pub(crate) renew_until: Option<Instant>,
    /// Granted on the caller's first try: nobody had been told the lock is busy then
    /// ([`GrantedAs::Quietly`]).
    pub(crate) first_try: bool,
    valid_until: AtomicU64,
    /// Handed over by the previous holder's release, held on the server for a short grant time
    /// until the watchdog's first renewal confirms it (then cleared).
    confirming: AtomicBool,
    /// Released by the backend's shutdown: the guard's own release has nothing left to do.
    released_at_shutdown: AtomicBool,
    lost: watch::Sender<Option<LostReason>>,
    /// The process-local turn for the key: other local waiters stay queued while we hold it.
    /// Given up on release, and as soon as the lease is lost — the key is no longer ours to keep.
    turn: Mutex<Option<Turn>>,
    /// A transfer of this lock to the owner token a local successor pledged may have run (its
    /// releaser never learnt): the release frees whichever of the two holds the key.
    transferred_to: OnceLock<Owner>,
    /// Made by [`unconfirmed`](Self::unconfirmed): no grant was ever answered.
    unconfirmed: bool,
    /// When this process's run of holders of the key in a row, which this lease belongs to,
    /// began: when the lock was requested (acquired) or came by a handover from another
    /// process, and the releaser's for a lock a local transfer granted. The release transfers
    /// the lock ahead of other processes' queued waiters only while the run is younger than the
    /// backend's `local_batch`.
    pub(crate) run_started: Instant,
}

impl HeldLease {
    /// A lease granted for a request sent at `requested_at`, valid for `terms.ttl` less drift.
    pub(crate) fn new(
        stats: Arc<Stats>,
        labels: Labels,
        key: String,
        owner: Owner,
        fence: u64,
        terms: &Terms,
        requested_at: Instant,
    ) -> HeldLease {
        let valid_for = valid_for(terms.ttl, terms.drift_factor);
        HeldLease {
            stats,
            labels,
            key,
            owner,
            fence,
            ttl: terms.ttl,
            kind: terms.kind,
            valid_for,
            renewing: terms.renewing,
            renew_until: terms.max_hold.map(|hold| requested_at + hold),
            first_try: false,
            valid_until: AtomicU64::new(to_nanos(requested_at + valid_for)),
            confirming: AtomicBool::new(false),
            released_at_shutdown: AtomicBool::new(false),
            lost: watch::Sender::new(None),
            turn: Mutex::new(None),
            run_started: requested_at,
            transferred_to: OnceLock::new(),
            unconfirmed: false,
        }
    }

    /// A lease whose acquire request was sent but never answered: the lock may or may not be
    /// held under `owner`, for up to `requested_ttl`. It exists only to be released (fencing token
    /// 0, never renewed); it counts as valid until that lock would have expired anyway, which is
    /// how long a failing background release keeps trying.
    pub(crate) fn unconfirmed(
        stats: Arc<Stats>,
        labels: Labels,
        key: String,
        owner: Owner,
        kind: LockKind,
        requested_ttl: Duration,
        turn: Option<Turn>,
    ) -> HeldLease {
        let terms = Terms {
            ttl: Duration::ZERO,
            drift_factor: 0.0,
            renewing: false,
            max_hold: None,
            kind,
        };
        let now = Instant::now();
        let mut lease = HeldLease::new(stats, labels, key, owner, 0, &terms, now);
        lease.unconfirmed = true;
        // The request has been sent, so it runs no later than the release sent after it: the
        // lock it may take expires before `now + requested_ttl`.
        lease
            .valid_until
            .store(to_nanos(now + requested_ttl), Ordering::Release);
        *lease.turn.lock().unwrap_or_else(|e| e.into_inner()) = turn;
        lease
    }

    /// A lease handed over by the previous holder's release: the server holds it for `grant`
    /// from some instant after `since` (the send time of the last request that queued this
    /// caller), so that is all it is valid for until the watchdog confirms it (within
    /// a third of that), whether or not the lease is renewed later.
    pub(crate) fn handed_over(&mut self, since: Instant, grant: Duration, drift_factor: f64) {
        *self.valid_until.get_mut() = to_nanos(since + valid_for(grant, drift_factor));
        *self.confirming.get_mut() = true;
        // `since` may be long before the handover came (the waiter waited after asking): the
        // process's run starts now.
        self.run_started = Instant::now();
    }

    /// Handed over and not yet confirmed by a renewal.
    pub(crate) fn confirming(&self) -> bool {
        self.confirming.load(Ordering::Acquire)
    }

    /// A renewal confirmed the handover: the lease is the caller's own TTL from now on.
    pub(crate) fn confirmed(&self) {
        self.confirming.store(false, Ordering::Release);
    }

    /// What the release can know of the value the lock was granted as.
    pub(crate) fn granted_as(&self) -> GrantedAs {
        match self.first_try && self.kind == LockKind::Exclusive && !self.is_unconfirmed() {
            true => GrantedAs::Quietly { fence: self.fence },
            false => GrantedAs::Unknown,
        }
    }

    /// `true` for a lease made by [`unconfirmed`](Self::unconfirmed): no grant was ever
    /// answered (an efficiency lock's token is 0 too, so the token cannot tell).
    pub(crate) fn is_unconfirmed(&self) -> bool {
        self.unconfirmed
    }

    pub(crate) fn keep_turn(&self, turn: Turn) {
        *self.turn.lock().unwrap_or_else(|e| e.into_inner()) = Some(turn);
    }

    /// A transfer of this lock to `successor` (a local successor's pledged owner token) may have
    /// run: from now on its release frees the key if either token holds it.
    pub(crate) fn may_have_transferred_to(&self, successor: Owner) {
        let _ = self.transferred_to.set(successor);
    }

    /// The owner token a transfer of this lock may have gone to ([`may_have_transferred_to`]).
    ///
    /// [`may_have_transferred_to`]: Self::may_have_transferred_to
    pub(crate) fn transferred_to(&self) -> Option<&Owner> {
        self.transferred_to.get()
    }

    /// Lets the next local waiter contend for the key.
    pub(crate) fn pass_turn(&self) {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner()).take();
        drop(turn);
    }

    /// The task of this process queued first behind this lease's turn, if any: its ticket and
    /// what it would hold the lock as.
    pub(crate) fn successor(&self) -> Option<(u64, Successor)> {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        turn.as_ref()?.successor()
    }

    /// Tells the key's release subscription (the turn's, if it has one) that a handover to
    /// `owner` may come: a release naming a successor may queue it for the lock it hands
    /// to another process, and that process's release can hand it over before this one
    /// has passed the turn on.
    pub(crate) fn expect_handover_to(&self, owner: &Owner) {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(watch) = turn.as_ref().and_then(|turn| turn.watch.as_ref()) {
            watch.expect_handover(owner.as_str());
        }
    }

    /// Passes the key's turn on with `lock`, transferred to the task of `ticket`
    /// ([`Turn::pass_transferred`]).
    pub(crate) fn pass_turn_transferred(&self, ticket: u64, lock: Box<dyn Transferred>) {
        let turn = self.turn.lock().unwrap_or_else(|e| e.into_inner()).take();
        match turn {
            Some(turn) => turn.pass_transferred(ticket, lock),
            // The turn went with a loss meanwhile: the lock is released (its drop).
            None => drop(lock),
        }
    }

    pub(crate) fn valid_until(&self) -> Instant {
        from_nanos(self.valid_until.load(Ordering::Acquire))
    }

    /// An extension sent at `sent_at`, valid for `valid_for` from then, was confirmed by the
    /// server ([`LockGuard::extend`](crate::LockGuard::extend)).
    pub(crate) fn extended(&self, sent_at: Instant, valid_for: Duration) {
        let until = to_nanos(sent_at + valid_for);
        self.valid_until.fetch_max(until, Ordering::AcqRel);
    }

    /// The backend's shutdown released this lease on the server.
    pub(crate) fn released_at_shutdown(&self) {
        self.released_at_shutdown.store(true, Ordering::Release);
    }

    /// Whether [`released_at_shutdown`](Self::released_at_shutdown) happened.
    pub(crate) fn was_released_at_shutdown(&self) -> bool {
        self.released_at_shutdown.load(Ordering::Acquire)
    }

    /// A renewal sent at `sent_at` was confirmed by the server.
    pub(crate) fn renewed(&self, sent_at: Instant) {
        let until = to_nanos(sent_at + self.valid_for);
        self.valid_until.fetch_max(until, Ordering::AcqRel);
    }

    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        *self.lost.borrow()
    }

    /// `Ok` while the lease is ours and inside its validity window; marks it lost otherwise.
    pub(crate) fn check(&self) -> Result<(), LockError> {
        if self.lost_reason().is_none() && Instant::now() >= self.valid_until() {
            self.mark_lost(self.expiry_reason());
        }
        match self.lost_reason() {
            None => Ok(()),
            Some(reason) => Err(LockError::Lost {
                key: self.key.clone(),
                reason,
            }),
        }
    }

    /// Why the validity window ran out.
    pub(crate) fn expiry_reason(&self) -> LostReason {
        match self.renew_until {
            Some(until) if self.renewing && until <= self.valid_until() => {
                LostReason::MaxHoldExceeded
            }
            _ => LostReason::Expired,
        }
    }

    /// Marks the lease lost, once; later calls keep the first reason.
    pub(crate) fn mark_lost(&self, reason: LostReason) {
        let first = self.lost.send_if_modified(|state| {
            if state.is_some() {
                return false;
            }
            *state = Some(reason);
            true
        });
        if first {
            self.pass_turn();
            Stats::bump(&self.stats.lost);
            metrics::lease_lost(&self.labels, reason.label());
            tracing::warn!(
                target: "distlock::lost",
                key = %self.key,
                fencing_token = self.fence,
                %reason,
                "lock lost"
            );
        }
    }

    /// Resolves when the lease is lost. Expiry is detected by the backend's watchdog, which keeps
    /// one timer for all leases.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Only observes; dropping the future changes nothing.
    pub(crate) async fn lost(&self) -> LostReason {
        let mut receiver = self.lost.subscribe();
        let reason = receiver
            .wait_for(Option::is_some)
            .await
            .map(|state| state.expect("waited for Some"));
        // The sender lives in `self`, so the channel cannot close while we borrow it.
        reason.expect("the lease owns its lost channel")
    }
}
