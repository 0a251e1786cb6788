//! Local convergence: the tasks of one process that want the same key form a FIFO queue, and
//! only the task holding the key's [`Turn`] contends on the server. A process with 50 waiting
//! tasks therefore sends the server the traffic of one, and its tasks are served in arrival order.
//!
//! The turn passes on when its holder is done with the key — released it, gave up, failed or was
//! cancelled — to the oldest waiter still waiting, together with the key's release
//! subscription, so the next contender needs no new SUBSCRIBE.
//!
//! A queued waiter names the owner token and TTL it would hold the lock with (its [`Successor`]),
//! so that the holder's release can transfer the lock to it on the server in the same step; the
//! turn then comes with the lock ([`Transferred`]).

use super::ReleaseWatch;
use crate::hooks::LocalChange;
use crate::lock::owner::Owner;
use crate::util::sparse::shrink_when_sparse;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// The queues of one backend, by key. An entry exists only while some task holds or waits for
/// its key, so memory is bounded by the keys in use.
#[derive(Default)]
pub(crate) struct Gates {
    queues: Mutex<HashMap<String, Queue>>,
}

#[derive(Default)]
struct Queue {
    next_ticket: u64,
    waiting: VecDeque<Waiter>,
}

/// A task queued for a key's turn.
struct Waiter {
    ticket: u64,
    successor: Successor,
    turn: oneshot::Sender<Turn>,
}

/// What a queued task would hold the lock as: the lock a local transfer grants it is written
/// with this owner token and TTL (and a place in the lock's queue, recorded by a release that
/// handed the lock to another process, names this token). The token is pledged to those only: a
/// task whose turn comes with neither asks for the lock with a new token, so that a transfer
/// whose outcome its releaser never learnt (and releases in the background) can never be the
/// lock the task relies on.
#[derive(Debug, Clone)]
pub(crate) struct Successor {
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    /// The transfer may go ahead of other processes' queued waiters: the run of this process's
    /// holders in a row that the releasing holder belongs to began less than the backend's
    /// `local_batch` ago (set by the release; `false` as queued).
    pub(crate) ahead_of_waiter: bool,
}

/// A lock that a local transfer granted to a queued task — or its place as the lock's next
/// waiter — handed to it with the key's turn. The task takes it with
/// [`claim`](Transferred::claim); dropped unclaimed (the task left after the release), its
/// `Drop` releases that lock, or gives that place up, in the background. Implemented by the
/// releasing side, which knows how to release.
pub(crate) trait Transferred: Send {
    /// Takes the lock, or the place, over.
    fn claim(self: Box<Self>) -> Claimed;
}

/// What a turn carried, taken by its task ([`Transferred::claim`]).
#[derive(Debug)]
pub(crate) enum Claimed {
    /// The lock, held with the owner token the task pledged and this fencing token, valid from
    /// `since` (when the transfer was sent).
    Lock {
        owner: Owner,
        fence: u64,
        since: Instant,
        /// When the run of this process's holders in a row that the task joins began: its
        /// lease's `run_started`.
        run_started: Instant,
    },
    /// The place in the lock's queue, recorded for the pledged owner token for `grant`
    /// from the server's reply to a request sent at `since`: the lock comes by handover.
    Place {
        owner: Owner,
        since: Instant,
        grant: Duration,
    },
}

/// The right to contend for (and then hold) one key within this process.
pub(crate) struct Turn {
    gates: Arc<Gates>,
    key: String,
    /// The key's release subscription, handed from contender to contender.
    pub(crate) watch: Option<ReleaseWatch>,
    /// The lock itself, transferred to the receiver of this turn by its previous holder's
    /// release; or, on the releasing side, the transfer to give to the waiter of that ticket.
    transfer: Option<(u64, Box<dyn Transferred>)>,
    /// Set on a turn that was handed on, so dropping this shell passes nothing.
    passed: bool,
}

/// Removes a queued waiter that stops waiting (deadline or cancellation) from the queue.
struct Ticket<'a> {
    gates: &'a Gates,
    key: &'a str,
    id: u64,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let _changed = LocalChange;
        let mut queues = self.gates.queues.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = queues.get_mut(self.key) {
            queue.waiting.retain(|waiter| waiter.ticket != self.id);
        }
    }
}

impl Gates {
    /// Waits for the key's turn, until `deadline` (`None`: forever). `None` when the deadline
    /// passed first. A task that has to queue offers to hold the lock for `ttl` if the holder
    /// transfers it ([`Turn::take_transferred`]).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropping the future leaves the queue (the ticket's `Drop`). A turn handed over just before
    /// the drop sits in the dropped channel and is dropped with it, which passes it on to the
    /// next waiter (and releases a lock transferred with it): no turn is ever lost, and no lock
    /// is left held.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &str,
        deadline: Option<Instant>,
        ttl: Duration,
    ) -> Option<Turn> {
        let (receiver, id) = {
            let _changed = LocalChange;
            let mut queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
            match queues.get_mut(key) {
                None => {
                    queues.insert(key.to_owned(), Queue::default());
                    return Some(self.turn(key.to_owned(), None));
                }
                Some(queue) => {
                    let (sender, receiver) = oneshot::channel();
                    queue.next_ticket += 1;
                    let id = queue.next_ticket;
                    queue.waiting.push_back(Waiter {
                        ticket: id,
                        successor: Successor {
                            owner: Owner::random(),
                            ttl,
                            ahead_of_waiter: false,
                        },
                        turn: sender,
                    });
                    (receiver, id)
                }
            }
        };
        let _ticket = Ticket {
            gates: self,
            key,
            id,
        };
        match deadline {
            None => receiver.await.ok(),
            Some(deadline) => tokio::time::timeout_at(deadline.into(), receiver)
                .await
                .ok()?
                .ok(),
        }
    }

    fn turn(self: &Arc<Self>, key: String, watch: Option<ReleaseWatch>) -> Turn {
        Turn {
            gates: self.clone(),
            key,
            watch,
            transfer: None,
            passed: false,
        }
    }

    /// Tasks queued behind a turn, over all keys.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn queued(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.values().map(|queue| queue.waiting.len()).sum()
    }

    /// Keys with a turn out.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn keys(&self) -> usize {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Turn {
    /// The oldest task queued behind this turn, if any: its ticket and what it would hold the
    /// lock as.
    pub(crate) fn successor(&self) -> Option<(u64, Successor)> {
        let queues = self.gates.queues.lock().unwrap_or_else(|e| e.into_inner());
        let waiter = queues.get(&self.key)?.waiting.front()?;
        Some((waiter.ticket, waiter.successor.clone()))
    }

    /// Passes the turn on with `lock`, transferred to the task of `ticket` (its
    /// [`successor`](Self::successor)). If that task has left meanwhile, the lock is dropped —
    /// which releases it — and the turn goes to the next task as it would without a transfer.
    pub(crate) fn pass_transferred(mut self, ticket: u64, lock: Box<dyn Transferred>) {
        self.transfer = Some((ticket, lock));
    }

    /// The lock (or place) transferred with this turn, if any, taken (the receiver holds it from
    /// now on).
    pub(crate) fn take_transferred(&mut self) -> Option<Claimed> {
        let (_, lock) = self.transfer.take()?;
        Some(lock.claim())
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.passed {
            return;
        }
        let _changed = LocalChange;
        let mut watch = self.watch.take();
        let mut transfer = self.transfer.take();
        let mut queues = self.gates.queues.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues.get_mut(&self.key) else {
            return;
        };
        while let Some(waiter) = queue.waiting.pop_front() {
            let mut next = self.gates.turn(std::mem::take(&mut self.key), watch.take());
            if transfer
                .as_ref()
                .is_some_and(|(ticket, _)| *ticket == waiter.ticket)
            {
                // Only to the task it was transferred to (the lock carries its owner token).
                next.transfer = transfer.take();
            }
            match waiter.turn.send(next) {
                Ok(()) => {
                    drop(queues);
                    // A transfer to a task that left before it: released by its drop.
                    drop(transfer);
                    return;
                }
                // That waiter is gone; take the turn back and try the next one.
                Err(mut returned) => {
                    returned.passed = true;
                    watch = returned.watch.take();
                    self.key = std::mem::take(&mut returned.key);
                    // Released below, once the queues are unlocked (its release may pass the
                    // turn of another key).
                    if let Some(orphan) = returned.transfer.take() {
                        transfer = Some(orphan);
                    }
                }
            }
        }
        queues.remove(&self.key);
        shrink_when_sparse(&mut queues);
        drop(queues);
        drop(transfer);
        // The last local interest in the key is gone: the subscription goes with it.
        drop(watch);
    }
}
