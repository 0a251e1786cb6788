//! The proxy's switchboard: fault settings written by the test thread and
//! read by the forwarding tasks, plus the counters the test asserts on.
//!
//! Settings that tasks must *wait* on (blackhole, resets, drop count) are
//! `watch` channels so that waiting is event-driven; plain flags are atomics.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// One armed "lose a reply" fault.
#[derive(Debug)]
struct DropRule {
    /// Only frames containing these bytes; `None`: the next reply that is not
    /// a RESP3 push (pushes are not replies to anything the client sent).
    needle: Option<Vec<u8>>,
    mode: DropMode,
}

impl DropRule {
    fn matches(&self, frame: &[u8]) -> bool {
        match &self.needle {
            None => frame.first() != Some(&b'>'),
            Some(needle) => needle.is_empty() || frame.windows(needle.len()).any(|w| w == needle),
        }
    }
}

/// What to do with a frame a drop rule claimed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DropMode {
    /// Swallow it and carry on.
    Silent,
    /// Swallow it and reset the connection.
    Reset,
    /// Deliver it, then reset the connection: the client got its answer and
    /// loses the connection right after.
    DeliverThenReset,
}

#[derive(Debug, Default)]
struct Connections {
    next_id: u64,
    /// Live connection id → reset epoch current when it was accepted.
    live: HashMap<u64, u64>,
}

#[derive(Debug)]
pub(super) struct Faults {
    /// How the byte streams are cut into requests and replies.
    pub(super) framing: Framing,
    /// A watch so that chunks already waiting out a delay notice a change.
    delay: watch::Sender<Duration>,
    refuse: AtomicBool,
    blackhole: watch::Sender<bool>,
    /// Bumped by every `reset_all`; a connection closes when it exceeds the
    /// value current at its accept.
    reset_epoch: watch::Sender<u64>,
    drop_rules: Mutex<VecDeque<DropRule>>,
    armed: AtomicUsize,
    drops: watch::Sender<usize>,
    commands: AtomicUsize,
    /// Client chunks read by the proxy and not yet written to the server (held by a delay or
    /// the blackhole).
    requests_held: watch::Sender<usize>,
    connections: Mutex<Connections>,
    /// Signalled whenever a connection closes.
    connection_closed: Condvar,
}

/// How a protocol cuts its byte streams into requests and replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// RESP frames (Redis, Valkey).
    Resp,
    /// A 4-byte big-endian length, then that many bytes (ZooKeeper's packets).
    LengthPrefixed,
}

/// Registration of one accepted connection; dropping it unregisters.
#[derive(Debug)]
pub(super) struct Ticket {
    id: u64,
    epoch: u64,
    faults: Arc<Faults>,
}

impl Ticket {
    /// Resolves once a `reset_all` issued after this connection's accept.
    pub(super) async fn reset(&self) {
        let epoch = self.epoch;
        let mut resets = self.faults.reset_epoch.subscribe();
        // Err means the sender is gone, i.e. the proxy is shutting down anyway.
        let _ = resets.wait_for(|&current| current > epoch).await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.faults.lock_connections().live.remove(&self.id);
        self.faults.connection_closed.notify_all();
    }
}

impl Faults {
    pub(super) fn new(framing: Framing) -> Self {
        Faults {
            framing,
            delay: watch::Sender::new(Duration::ZERO),
            refuse: AtomicBool::new(false),
            blackhole: watch::Sender::new(false),
            reset_epoch: watch::Sender::new(0),
            drop_rules: Mutex::default(),
            armed: AtomicUsize::new(0),
            drops: watch::Sender::new(0),
            commands: AtomicUsize::new(0),
            requests_held: watch::Sender::new(0),
            connections: Mutex::default(),
            connection_closed: Condvar::new(),
        }
    }

    pub(super) fn watch_delay(&self) -> watch::Receiver<Duration> {
        self.delay.subscribe()
    }

    pub(super) fn set_delay(&self, delay: Duration) {
        self.delay.send_replace(delay);
    }

    pub(super) fn refusing(&self) -> bool {
        self.refuse.load(Ordering::Relaxed)
    }

    pub(super) fn set_refuse(&self, on: bool) {
        self.refuse.store(on, Ordering::Relaxed);
    }

    pub(super) fn set_blackhole(&self, on: bool) {
        self.blackhole.send_replace(on);
    }

    pub(super) fn watch_blackhole(&self) -> watch::Receiver<bool> {
        self.blackhole.subscribe()
    }

    pub(super) fn arm_drop(&self, needle: Option<&[u8]>, mode: DropMode) {
        let rule = DropRule {
            needle: needle.map(<[u8]>::to_vec),
            mode,
        };
        self.lock_rules().push_back(rule);
        self.armed.fetch_add(1, Ordering::Relaxed);
    }

    /// Claims the first armed rule matching `frame`, if any.
    pub(super) fn claim_drop(&self, frame: &[u8]) -> Option<DropMode> {
        let mut rules = self.lock_rules();
        let index = rules.iter().position(|rule| rule.matches(frame))?;
        Some(rules.remove(index)?.mode)
    }

    /// Counts a completed drop; called only once its effects (the reset) are
    /// visible, so a test woken by it can assert on them right away.
    pub(super) fn record_drop(&self) {
        self.drops.send_modify(|drops| *drops += 1);
    }

    pub(super) fn armed(&self) -> usize {
        self.armed.load(Ordering::Relaxed)
    }

    pub(super) fn drops(&self) -> usize {
        *self.drops.borrow()
    }

    pub(super) fn watch_drops(&self) -> watch::Receiver<usize> {
        self.drops.subscribe()
    }

    pub(super) fn add_commands(&self, n: usize) {
        self.commands.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn commands(&self) -> usize {
        self.commands.load(Ordering::Relaxed)
    }

    /// A client chunk was read (`+1`) or written on to the server or lost (`-1`).
    pub(super) fn request_held(&self, delta: isize) {
        self.requests_held
            .send_modify(|held| *held = held.saturating_add_signed(delta));
    }

    pub(super) fn requests_held(&self) -> usize {
        *self.requests_held.borrow()
    }

    pub(super) fn watch_requests_held(&self) -> watch::Receiver<usize> {
        self.requests_held.subscribe()
    }

    pub(super) fn open_connection(self: &Arc<Self>) -> Ticket {
        let mut connections = self.lock_connections();
        // Read the epoch under the same lock reset_all bumps it under, so
        // every connection is unambiguously before or after a reset.
        let epoch = *self.reset_epoch.borrow();
        let id = connections.next_id;
        connections.next_id += 1;
        connections.live.insert(id, epoch);
        Ticket {
            id,
            epoch,
            faults: Arc::clone(self),
        }
    }

    pub(super) fn open_connections(&self) -> usize {
        self.lock_connections().live.len()
    }

    /// Closes every connection open now and waits (up to `timeout`) until
    /// they are gone; false if some were still open then.
    pub(super) fn reset_all(&self, timeout: Duration) -> bool {
        let connections = self.lock_connections();
        let mut epoch = 0;
        self.reset_epoch.send_modify(|current| {
            *current += 1;
            epoch = *current;
        });
        let (connections, _) = self
            .connection_closed
            .wait_timeout_while(connections, timeout, |c| {
                c.live.values().any(|&e| e < epoch)
            })
            .unwrap_or_else(PoisonError::into_inner);
        !connections.live.values().any(|&e| e < epoch)
    }

    fn lock_rules(&self) -> MutexGuard<'_, VecDeque<DropRule>> {
        self.drop_rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn lock_connections(&self) -> MutexGuard<'_, Connections> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}
