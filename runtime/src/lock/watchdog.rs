//! The watchdog: one task per backend renews every live watchdog lease in batched script calls,
//! and notices expiry of any lease, with one timer for all of them.
//!
//! Leases are registered when acquired and deregistered the moment their call returns, panics or
//! is dropped (the guard's `Drop` does it synchronously), so renewal never outlives the call. The
//! task exits once no lease has been registered for a second and is spawned again, on the
//! current runtime, by the next registration.

use crate::engines::engine::{Engine, Ownership, Renewal};
use crate::error::LostReason;
use crate::lock::lease::HeldLease;
use crate::operating::metrics;
use crate::operating::stats::Stats;
use crate::util::sparse::shrink_when_sparse;
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use tracing::Instrument;

/// Identifies one registered lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LeaseId(u64);

/// The watchdog of one backend: it knows the engine to renew with, never the backend handle.
pub(crate) struct Watchdog {
    shared: Arc<Shared>,
}

struct Shared {
    engine: Arc<dyn Engine>,
    /// Most leases renewed by one engine call.
    renew_batch: usize,
    stats: Arc<Stats>,
    table: Mutex<Table>,
    /// Wakes the task when a lease is registered whose deadlines are earlier than the timer's.
    wake: Notify,
    /// Times a registration woke the task, since the start.
    woken: AtomicU64,
}

#[derive(Default)]
struct Table {
    next_id: u64,
    entries: HashMap<LeaseId, Entry>,
    /// Cleared by the task when it exits or when its runtime drops it.
    task_alive: Option<Arc<AtomicBool>>,
    /// When the task will look next (`None`: only when woken). A new lease wakes the task only
    /// if it needs attention earlier — with one TTL per backend it never does, so taking a lock
    /// costs the watchdog nothing.
    next_look: Option<Instant>,
    /// The task's last look found no lease: it idles until its grace ends.
    idle: bool,
}

struct Entry {
    lease: Arc<HeldLease>,
    next_renewal: Instant,
    renewal_in_flight: bool,
}

/// How long the task lingers with no lease before it exits.
const IDLE_GRACE: Duration = Duration::from_secs(1);

/// How soon a failed renewal is retried: often enough to recover within the lease, rarely enough
/// not to hammer a server that is down.
fn retry_after(ttl: Duration) -> Duration {
    (ttl / 10).min(Duration::from_secs(1))
}

impl Watchdog {
    pub(crate) fn new(engine: Arc<dyn Engine>, renew_batch: usize, stats: Arc<Stats>) -> Self {
        Watchdog {
            shared: Arc::new(Shared {
                engine,
                renew_batch,
                stats,
                table: Mutex::default(),
                wake: Notify::new(),
                woken: AtomicU64::new(0),
            }),
        }
    }

    pub(crate) fn register(&self, lease: Arc<HeldLease>) -> LeaseId {
        let mut table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        table.next_id += 1;
        let id = LeaseId(table.next_id);
        // A handed-over lease is confirmed (renewed to its TTL) once a third of what is left of
        // its grant has passed: two thirds remain for the renewal's round trip, and a short
        // critical section releases it before then, without waking the watchdog at all.
        let now = Instant::now();
        let next_renewal = match lease.confirming() {
            true => now + lease.valid_until().saturating_duration_since(now) / 3,
            false => now + lease.ttl / 3,
        };
        let first_deadline = if lease.renewing || lease.confirming() {
            next_renewal.min(lease.valid_until())
        } else {
            lease.valid_until()
        };
        table.entries.insert(
            id,
            Entry {
                lease,
                next_renewal,
                renewal_in_flight: false,
            },
        );
        let running = table
            .task_alive
            .as_ref()
            .is_some_and(|alive| alive.load(Ordering::Acquire));
        if !running {
            let alive = Arc::new(AtomicBool::new(true));
            table.task_alive = Some(alive.clone());
            tokio::spawn(run(self.shared.clone(), AliveGuard(alive)));
        }
        let wake = !running || table.next_look.is_none_or(|look| first_deadline < look);
        drop(table);
        if wake {
            self.shared.woken.fetch_add(1, Ordering::Relaxed);
            self.shared.wake.notify_one();
        }
        id
    }

    /// Every registered lease, deregistered: nothing is renewed or watched any more.
    pub(crate) fn take_all(&self) -> Vec<Arc<HeldLease>> {
        let mut table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        let leases = std::mem::take(&mut table.entries)
            .into_values()
            .map(|entry| entry.lease)
            .collect();
        drop(table);
        self.shared.wake.notify_one();
        leases
    }

    pub(crate) fn deregister(&self, id: LeaseId) {
        let mut table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        table.entries.remove(&id);
        shrink_when_sparse(&mut table.entries);
    }

    /// Times a registration woke the task since the start.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn woken(&self) -> u64 {
        self.shared.woken.load(Ordering::Relaxed)
    }

    /// Whether the task is running and its last look found no lease (it idles).
    #[cfg(distlock_test_hooks)]
    pub(crate) fn is_idle(&self) -> bool {
        let table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        table.idle
            && table
                .task_alive
                .as_ref()
                .is_some_and(|alive| alive.load(Ordering::Acquire))
    }

    /// Leases currently registered (renewed or watched for expiry).
    #[cfg(distlock_test_hooks)]
    pub(crate) fn registered(&self) -> usize {
        self.shared
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }
}

/// Marks the task dead however it ends: by returning, or by its runtime dropping it.
struct AliveGuard(Arc<AtomicBool>);

impl Drop for AliveGuard {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

struct BatchOutcome {
    sent_at: Instant,
    ids: Vec<LeaseId>,
    /// `None`: the call failed; an answer of `None`: the engine could not decide for that lease.
    answers: Option<Vec<Option<Ownership>>>,
}

/// The watchdog task: renews due leases in batches, marks expired ones lost, and exits once it
/// has had no lease for `IDLE_GRACE`.
///
/// # Cancel safety
/// Never dropped by a caller.
/// A spawned task, never dropped by a caller. Dropped by its runtime shutting down, it is
/// marked dead (`AliveGuard`) and the next registration spawns another; the batches in flight
/// go with it, and their leases' in-flight marks are cleared (`InFlightMarks`), so that task
/// renews them.
async fn run(shared: Arc<Shared>, _alive: AliveGuard) {
    let mut in_flight = FuturesUnordered::new();
    let mut idle_since: Option<Instant> = None;
    loop {
        let _looked = crate::hooks::LocalChange;
        let (due, wake_at) = {
            let mut table = shared.table.lock().unwrap_or_else(|e| e.into_inner());
            table.idle = table.entries.is_empty() && in_flight.is_empty();
            if table.entries.is_empty() && in_flight.is_empty() {
                // Linger a while before exiting: a service that takes and returns locks one
                // after another would otherwise start a task for every lock.
                let now = Instant::now();
                let since = *idle_since.get_or_insert(now);
                if now >= since + IDLE_GRACE {
                    table.task_alive = None;
                    return;
                }
                // The task looks again when the grace ends: a registration wakes it only if its
                // lease needs a look before then. (Waking it for every lease would cost a service
                // that takes one lock after another a task wake-up per lock — and, woken into the
                // caller's worker while its release is sent, another worker thread woken to run
                // it.)
                let idle_end = since + IDLE_GRACE;
                table.next_look = Some(idle_end);
                (Vec::new(), Some(idle_end))
            } else {
                idle_since = None;
                let (due, wake_at) = scan(&mut table, Instant::now());
                // Recorded under the lock that `register` takes, so a lease registered after
                // this scan either sees this instant or finds the task not yet sleeping on it.
                table.next_look = wake_at;
                (due, wake_at)
            }
        };
        for batch in due.chunks(shared.renew_batch) {
            let marks = InFlightMarks {
                shared: shared.clone(),
                ids: batch.iter().map(|(id, _)| *id).collect(),
                settled: false,
            };
            in_flight.push(renew(shared.clone(), batch.to_vec(), marks));
        }
        // Rescan when the timer fires, when a registration needs an earlier look, or when the
        // last batch of a round has answered — not after every batch: with thousands of leases a
        // scan per reply would make a period's cost grow with the square of the leases.
        let mut wake_at = wake_at;
        loop {
            let sleep = async {
                match wake_at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = sleep => break,
                () = shared.wake.notified() => break,
                Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                    if let Some(retry_at) = apply(&shared, outcome) {
                        wake_at = Some(wake_at.map_or(retry_at, |at| at.min(retry_at)));
                    }
                    if in_flight.is_empty() {
                        break;
                    }
                }
            }
        }
    }
}

/// Marks expired leases lost and picks the leases to renew now; returns them with the instant the
/// task must look again.
///
/// When one lease is due, every lease renewed more than a tenth of a period ago is renewed with
/// it: renewing early costs little, and it brings leases taken at different times into one phase
/// at once, so a period needs ceil(leases / batch) calls rather than one per acquisition time.
fn scan(table: &mut Table, now: Instant) -> (Vec<(LeaseId, Arc<HeldLease>)>, Option<Instant>) {
    let mut wake_at: Option<Instant> = None;
    let mut wake = |at: Instant| wake_at = Some(wake_at.map_or(at, |earliest| earliest.min(at)));
    let mut ripe: Vec<(LeaseId, Arc<HeldLease>)> = Vec::new();
    let mut any_due = false;
    for (id, entry) in table.entries.iter_mut() {
        let lease = &entry.lease;
        if lease.lost_reason().is_some() {
            continue;
        }
        let valid_until = lease.valid_until();
        if now >= valid_until {
            lease.mark_lost(lease.expiry_reason());
            continue;
        }
        wake(valid_until);
        let may_renew = lease.confirming()
            || (lease.renewing && lease.renew_until.is_none_or(|until| now < until));
        if !may_renew || entry.renewal_in_flight {
            continue;
        }
        any_due |= now >= entry.next_renewal;
        // Ripe: renewed (or taken) at least a tenth of a period ago.
        let period = lease.ttl / 3;
        if now + period - period / 10 >= entry.next_renewal {
            ripe.push((*id, lease.clone()));
        }
        wake(entry.next_renewal);
    }
    if !any_due {
        return (Vec::new(), wake_at);
    }
    for (id, _) in &ripe {
        if let Some(entry) = table.entries.get_mut(id) {
            entry.renewal_in_flight = true;
        }
    }
    (ripe, wake_at)
}

/// The in-flight marks `scan` set on one renewal batch's leases. `apply` clears them with the
/// batch's outcome; a batch dropped unfinished — its task dropped by a runtime shutting down,
/// before or during the call — clears them here, or no later task would renew those leases.
struct InFlightMarks {
    shared: Arc<Shared>,
    ids: Vec<LeaseId>,
    settled: bool,
}

impl Drop for InFlightMarks {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let mut table = self.shared.table.lock().unwrap_or_else(|e| e.into_inner());
        for id in &self.ids {
            if let Some(entry) = table.entries.get_mut(id) {
                entry.renewal_in_flight = false;
            }
        }
    }
}

/// Renews one batch of leases in one engine call; the outcome is for `apply`.
///
/// # Cancel safety
/// Cancel safe: no lease relies on a renewal that was not confirmed.
/// Dropped only with the watchdog task (see `run`). A renewal already sent may still extend
/// the leases on the server, as with a lost reply; a lease's validity counts only confirmed
/// renewals, so it never relies on that extension. The leases' in-flight marks are cleared by
/// `marks` (even if this future never ran), so the next task renews them.
async fn renew(
    shared: Arc<Shared>,
    batch: Vec<(LeaseId, Arc<HeldLease>)>,
    mut marks: InFlightMarks,
) -> BatchOutcome {
    let sent_at = Instant::now();
    let items: Vec<Renewal<'_>> = batch
        .iter()
        .map(|(_, lease)| Renewal {
            key: &lease.key,
            owner: &lease.owner,
            ttl: lease.ttl,
            kind: lease.kind,
        })
        .collect();
    let span = tracing::debug_span!("distlock.renew", leases = items.len());
    // The span wraps the future, so it is entered only while this future is polled: entered
    // across the await instead, every task polled on this thread meanwhile would log inside it.
    let answers = async {
        Stats::bump(&shared.stats.renewal_calls);
        match shared.engine.renew(&items).await {
            Ok(answers) => Some(answers),
            Err(failure) => {
                tracing::warn!(
                    target: "distlock::renew",
                    leases = items.len(),
                    error = %failure.source,
                    "renewal failed; retrying while the leases are still valid"
                );
                None
            }
        }
    }
    .instrument(span)
    .await;
    // `apply` clears the marks with the outcome, in the same poll that takes it.
    marks.settled = true;
    BatchOutcome {
        sent_at,
        ids: batch.iter().map(|(id, _)| *id).collect(),
        answers,
    }
}

/// Applies a batch's answers; returns when a failed renewal is to be retried, if one failed.
fn apply(shared: &Shared, outcome: BatchOutcome) -> Option<Instant> {
    let mut table = shared.table.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    let mut retry_at = None;
    for (i, id) in outcome.ids.iter().enumerate() {
        // A lease released while its renewal was in flight is no longer ours to judge.
        let Some(entry) = table.entries.get_mut(id) else {
            continue;
        };
        entry.renewal_in_flight = false;
        let lease = &entry.lease;
        match outcome.answers.as_ref().and_then(|answers| answers[i]) {
            Some(Ownership::Ours) => {
                lease.renewed(outcome.sent_at);
                lease.confirmed();
                Stats::bump(&shared.stats.renewed);
                metrics::renewed(&lease.labels);
                entry.next_renewal = outcome.sent_at + lease.ttl / 3;
            }
            Some(Ownership::Gone) => lease.mark_lost(LostReason::Gone),
            Some(Ownership::TakenOver) => lease.mark_lost(LostReason::TakenOver),
            None => {
                entry.next_renewal = now + retry_after(lease.ttl);
                retry_at = Some(
                    retry_at.map_or(entry.next_renewal, |at: Instant| at.min(entry.next_renewal)),
                );
            }
        }
    }
    retry_at
}
