//! Group commit: concurrent calls of one script on one server coalesced into one script call (and
//! concurrent SUBSCRIBEs into one SUBSCRIBE of many channels, `pubsub.rs`).
//!
//! A call that finds fewer than [`MAX_IN_FLIGHT`] calls of its kind in flight is sent at once, on
//! its own — a lone caller never waits for a batch. Calls that arrive while that many are in
//! flight queue; when an in-flight call's reply comes back, the queue (up to [`MAX_BATCH`]
//! items) goes out as one script call, sent by a task of its own so that no caller's
//! cancellation can strand the others. Under load every round trip carries a batch: 64 tasks cost
//! the server a few script calls per round trip instead of 64, and the client one command per
//! batch instead of one per call.
//!
//! A queued caller that leaves still has its item sent with the next batch (items are not taken
//! back from the queue: the batch may already be on its way); [`Batched::abandoned`] then undoes
//! what the item did — a granted acquire is released (a release, done either way, needs nothing
//! undone).

use crate::engines::engine::{EngineFailure, EngineResult};
use futures_util::future::BoxFuture;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// Calls of one kind in flight before new ones queue. Four keep a few callers pipelined, each
/// sent at once, while the server has a CPU of its own; beyond that, batching beats pipelining.
/// Measured (bench/HISTORY.md, *Group commit*): against two, four raised 8 tasks' cycles/s by a
/// third with the server on a CPU of its own and cut the open loop's Zipf p99 tenfold at a
/// quarter load, and changed nothing measurable with client and server on one CPU; eight cost
/// 10–15 % there.
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// Items per batched script call: a batch runs on the server as one script, which blocks
/// other clients for its duration (≈ 1–2 µs per item).
pub(crate) const MAX_BATCH: usize = 128;

/// A script that takes many items and answers each.
pub(crate) trait Batched: Send + Sync + 'static {
    type Item: Send + 'static;
    type Answer: Send + 'static;

    /// Runs the items as one call: one answer per item, in order.
    fn run<'a>(&'a self, items: &'a [Self::Item])
        -> BoxFuture<'a, EngineResult<Vec<Self::Answer>>>;

    /// The caller of `item` left before its answer came; undo what the answer says was done.
    fn abandoned(self: &Arc<Self>, item: Self::Item, answer: Self::Answer);

    /// The caller of `item` left, and the batch's answer was lost: undo what it may have done.
    fn abandoned_unanswered(self: &Arc<Self>, item: Self::Item);
}

pub(crate) struct GroupCommit<B: Batched> {
    script: Arc<B>,
    state: Arc<Mutex<State<B>>>,
    /// Items that queued for a batch, since the start.
    queued: AtomicU64,
}

struct State<B: Batched> {
    in_flight: usize,
    queue: Vec<Queued<B>>,
}

/// Where a submitted item goes.
enum Route<B: Batched> {
    /// Sent on its own, in a free in-flight slot.
    Alone(B::Item),
    /// Queued for the next batch; its answer comes on this channel.
    Queued(oneshot::Receiver<EngineResult<B::Answer>>),
}

struct Queued<B: Batched> {
    item: B::Item,
    reply: oneshot::Sender<EngineResult<B::Answer>>,
}

impl<B: Batched> GroupCommit<B> {
    pub(crate) fn new(script: Arc<B>) -> Self {
        GroupCommit {
            script,
            state: Arc::new(Mutex::new(State {
                in_flight: 0,
                queue: Vec::new(),
            })),
            queued: AtomicU64::new(0),
        }
    }

    /// Items that queued for a batch instead of going out on their own, since the start.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn queued(&self) -> u64 {
        self.queued.load(Ordering::Relaxed)
    }

    /// Runs `item`, alone or in a batch.
    ///
    /// # Cancel safety
    /// Not cancel safe: an item already sent may still run.
    /// Dropped while sent on its own, the item may still run (as any dropped command: the caller
    /// keeps what it needs to undo it), and the queue it held back is handed to a task. Dropped
    /// while queued, the item is still sent with its batch and [`Batched::abandoned`] undoes it.
    pub(crate) async fn submit(&self, item: B::Item) -> EngineResult<B::Answer> {
        let route: Route<B> = {
            let mut state = lock(&self.state);
            if state.in_flight < MAX_IN_FLIGHT {
                state.in_flight += 1;
                Route::Alone(item)
            } else {
                let (reply, answer) = oneshot::channel();
                state.queue.push(Queued { item, reply });
                self.queued.fetch_add(1, Ordering::Relaxed);
                crate::hooks::local_changed();
                Route::Queued(answer)
            }
        };
        let answer = match route {
            Route::Alone(item) => return self.run_alone(item).await,
            Route::Queued(answer) => answer,
        };
        answer.await.unwrap_or_else(|_| {
            Err(EngineFailure::ambiguous(
                "the batch carrying this request ended with its runtime",
            ))
        })
    }

    /// Sends `item` on its own, in an in-flight slot already taken.
    ///
    /// # Cancel safety
    /// Not cancel safe: the item may still run.
    /// Dropped while the item is sent, it may still run (the caller keeps what it needs to undo
    /// it); the in-flight slot is given up at once (`InFlight`'s `Drop`), and the calls queued
    /// behind it go out from a task, so none of them waits on this caller.
    async fn run_alone(&self, item: B::Item) -> EngineResult<B::Answer> {
        let slot = InFlight {
            script: &self.script,
            state: &self.state,
        };
        let answer = self.script.run(std::slice::from_ref(&item)).await;
        drop(slot);
        answer.and_then(|mut answers| {
            let answer = answers.pop();
            answer.ok_or_else(|| unexpected_length(0, 1))
        })
    }
}

/// One call in flight; when it ends (answered or dropped), the queue it held back is sent.
struct InFlight<'a, B: Batched> {
    script: &'a Arc<B>,
    state: &'a Arc<Mutex<State<B>>>,
}

impl<B: Batched> Drop for InFlight<'_, B> {
    fn drop(&mut self) {
        let mut state = lock(self.state);
        if state.queue.is_empty() {
            state.in_flight -= 1;
            return;
        }
        drop(state);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                // The slot goes with the task: a runtime shutting down drops the task, perhaps
                // unpolled, and `FlushSlot` then frees it.
                let slot = FlushSlot {
                    state: self.state.clone(),
                    finished: false,
                };
                runtime.spawn(flush(self.script.clone(), slot));
            }
            Err(_) => {
                // No runtime to send with: the queued callers get an error (their senders are
                // dropped), and the slot is free for the next call.
                let mut state = lock(self.state);
                state.queue.clear();
                state.in_flight -= 1;
            }
        }
    }
}

/// The in-flight slot a `flush` task holds, freed however the task ends: by `flush` itself when
/// it finds the queue empty (under the lock that `submit` takes, so nothing queues unsent), or by
/// this guard's `Drop` when the task's runtime drops it, mid-batch or before it first ran.
struct FlushSlot<B: Batched> {
    state: Arc<Mutex<State<B>>>,
    finished: bool,
}

impl<B: Batched> Drop for FlushSlot<B> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        // No runtime is left to send the queue with: its callers get an ambiguous error (their
        // senders drop with it; nothing of theirs was sent), and the slot is free for the next
        // call, which goes out on its own.
        let mut state = lock(&self.state);
        state.queue.clear();
        state.in_flight -= 1;
    }
}

/// Sends the queue in batches until it is empty, then frees its in-flight slot.
///
/// # Cancel safety
/// Never dropped by a caller.
/// Runs as a spawned task, never dropped by a caller. Dropped by its runtime shutting down
/// (even before it first ran), its `FlushSlot` frees the slot and drops the queue: the callers
/// of the batch in flight and of the queue get an ambiguous error, and the engine's next calls
/// go out on their own.
async fn flush<B: Batched>(script: Arc<B>, mut slot: FlushSlot<B>) {
    loop {
        let batch: Vec<Queued<B>> = {
            let mut state = lock(&slot.state);
            if state.queue.is_empty() {
                state.in_flight -= 1;
                slot.finished = true;
                return;
            }
            let take = state.queue.len().min(MAX_BATCH);
            state.queue.drain(..take).collect()
        };
        let (items, replies): (Vec<B::Item>, Vec<_>) = batch
            .into_iter()
            .map(|queued| (queued.item, queued.reply))
            .unzip();
        match script.run(&items).await {
            Ok(answers) if answers.len() == items.len() => {
                for ((item, reply), answer) in items.into_iter().zip(replies).zip(answers) {
                    if let Err(Ok(answer)) = reply.send(Ok(answer)) {
                        script.abandoned(item, answer);
                    }
                }
            }
            Ok(answers) => {
                let failure = unexpected_length(answers.len(), items.len());
                fail_all(&script, items, replies, &failure);
            }
            Err(failure) => fail_all(&script, items, replies, &failure),
        }
    }
}

/// Hands every caller of a failed batch the failure; an ambiguous one may have run the items of
/// callers that left, which are undone.
fn fail_all<B: Batched>(
    script: &Arc<B>,
    items: Vec<B::Item>,
    replies: Vec<oneshot::Sender<EngineResult<B::Answer>>>,
    failure: &EngineFailure,
) {
    for (item, reply) in items.into_iter().zip(replies) {
        let sent = reply.send(Err(EngineFailure {
            ambiguous: failure.ambiguous,
            source: failure.source.to_string().into(),
        }));
        if sent.is_err() && failure.ambiguous {
            script.abandoned_unanswered(item);
        }
    }
}

fn unexpected_length(got: usize, sent: usize) -> EngineFailure {
    EngineFailure::ambiguous(format!("a batched script answered {got} items of {sent}"))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
