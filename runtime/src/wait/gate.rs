//! Local convergence: the tasks of one process that want the same key form a FIFO queue, and
//! only the task holding the key's [`Turn`] contends on the server. A process with 50 waiting
//! tasks therefore sends the server the traffic of one, and its tasks are served in arrival order.
//!
//! The turn passes on when its holder is done with the key — released it, gave up, failed or was
//! cancelled — to the oldest waiter still waiting, together with the key's release
//! subscription, so the next contender needs no new SUBSCRIBE.

use super::ReleaseWatch;
use crate::hooks::LocalChange;
use crate::sparse::shrink_when_sparse;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Instant;
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
    waiting: VecDeque<(u64, oneshot::Sender<Turn>)>,
}

/// The right to contend for (and then hold) one key within this process.
pub(crate) struct Turn {
    gates: Arc<Gates>,
    key: String,
    /// The key's release subscription, handed from contender to contender.
    pub(crate) watch: Option<ReleaseWatch>,
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
            queue.waiting.retain(|(id, _)| *id != self.id);
        }
    }
}

impl Gates {
    /// Waits for the key's turn, until `deadline` (`None`: forever). `None` when the deadline
    /// passed first.
    ///
    /// # Cancel safety
    /// Dropping the future leaves the queue (the ticket's `Drop`). A turn handed over just before
    /// the drop sits in the dropped channel and is dropped with it, which passes it on to the
    /// next waiter: no turn is ever lost.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        key: &str,
        deadline: Option<Instant>,
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
                    queue.waiting.push_back((id, sender));
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
            passed: false,
        }
    }

    /// Tasks queued behind a turn, over all keys.
    pub(crate) fn queued(&self) -> usize {
        let queues = self.queues.lock().unwrap_or_else(|e| e.into_inner());
        queues.values().map(|queue| queue.waiting.len()).sum()
    }

    /// Keys with a turn out.
    pub(crate) fn keys(&self) -> usize {
        self.queues.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        if self.passed {
            return;
        }
        let _changed = LocalChange;
        let mut watch = self.watch.take();
        let mut queues = self.gates.queues.lock().unwrap_or_else(|e| e.into_inner());
        let Some(queue) = queues.get_mut(&self.key) else {
            return;
        };
        while let Some((_, sender)) = queue.waiting.pop_front() {
            let next = self.gates.turn(std::mem::take(&mut self.key), watch.take());
            match sender.send(next) {
                Ok(()) => return,
                // That waiter is gone; take the turn back and try the next one.
                Err(mut returned) => {
                    returned.passed = true;
                    watch = returned.watch.take();
                    self.key = std::mem::take(&mut returned.key);
                }
            }
        }
        queues.remove(&self.key);
        shrink_when_sparse(&mut queues);
        drop(queues);
        // The last local interest in the key is gone: the subscription goes with it.
        drop(watch);
    }
}
