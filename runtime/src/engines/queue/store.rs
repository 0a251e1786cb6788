//! [`Store`]: what a store that orders entries does for the queue engine — only what it alone
//! can (write, read and delete entries, keep their time, tell of deletions); everything that
//! follows from the order of the entries is the engine's.

use super::order::Entry;
use crate::engines::engine::{EngineResult, Renewal};
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::KeyEventSender;
use futures_util::stream::BoxStream;
use std::fmt;
use std::future::Future;
use std::time::Duration;

/// A store of lock queues: each contender for a lock writes one entry, the store numbers it in
/// the order entries are written (etcd's creation revision, a database's sequence), and the
/// number is the entry's place and its holder's fencing token.
///
/// Each step that matters is atomic in the store: a join writes and reads the queue in one
/// transaction (it may ask for a lease first), a leave or a removal checks what it deletes, and
/// each entry of a renewal is renewed whole or not at all (a batch may take several
/// transactions).
///
/// # Cancel safety
/// Not cancel safe: a request already sent may still take effect.
/// As with [`Engine`](crate::engines::engine::Engine), a future dropped after its request left
/// may still have its effect on the store, exactly like a lost reply, and the engine treats
/// both alike: a join runs to its end in a task of its own and its entry is left in the
/// background; a renewal dropped midway may have renewed part of its batch, which the watchdog
/// counts as a failed renewal and asks again; a read, a time left and a watch still being
/// opened leave nothing behind.
pub(crate) trait Store: Send + Sync + 'static {
    /// What an entry's time is kept by, as the store reads it back (etcd: the lease's id; a
    /// store that reads the time left with the entry: that time).
    type Lease: Copy + fmt::Debug + Send + Sync + 'static;

    /// `owner` joins `key`'s queue as `kind` with an entry that lives `ttl` unless renewed —
    /// or, with an entry there already, keeps its place and its time starts again — and the
    /// queue is read in the same step.
    fn join(
        &self,
        key: &str,
        owner: &Owner,
        kind: LockKind,
        ttl: Duration,
    ) -> impl Future<Output = EngineResult<Read<Self::Lease>>> + Send;

    /// Deletes `owner`'s entry in `key`'s queue, if it is there.
    fn leave(
        &self,
        key: &str,
        owner: &Owner,
    ) -> impl Future<Output = EngineResult<Presence>> + Send;

    /// Starts each entry's time again, `ttl` from now: one answer per renewal, in order
    /// (`None`: the store could not say for that one).
    fn renew(
        &self,
        batch: &[Renewal<'_>],
    ) -> impl Future<Output = EngineResult<Vec<Option<Presence>>>> + Send;

    /// `key`'s queue, oldest entry first.
    fn read(&self, key: &str)
        -> impl Future<Output = EngineResult<Vec<Entry<Self::Lease>>>> + Send;

    /// Deletes `entry` from `key`'s queue if it is still the one read (the same token);
    /// whether it did.
    fn remove(
        &self,
        key: &str,
        entry: &Entry<Self::Lease>,
    ) -> impl Future<Output = EngineResult<bool>> + Send;

    /// How long `entry` of `key`'s queue lives at most unless renewed; `None` when the store
    /// cannot say.
    fn time_left(
        &self,
        key: &str,
        entry: &Entry<Self::Lease>,
    ) -> impl Future<Output = Option<Duration>> + Send;

    /// A watch of the deletions in `key`'s queue, in force once this resolves: every deletion
    /// from then on, in the store's order, until the link breaks (the stream ends).
    fn deletions(&self, key: &str) -> impl Future<Output = EngineResult<Deletions>> + Send;

    /// The keys (without the prefix) that have a queue; the engine filters them.
    fn keys(&self) -> impl Future<Output = EngineResult<Vec<String>>> + Send;

    /// Sends every write and deletion in `key`'s queue to `events` until nobody listens;
    /// resolves once that is in force (`distlock watch`).
    fn follow(
        &self,
        key: &str,
        events: KeyEventSender,
    ) -> impl Future<Output = EngineResult<()>> + Send;

    /// The store's settings and state that weaken locks.
    fn doctor(&self) -> impl Future<Output = EngineResult<Vec<Finding>>> + Send;

    /// The caller's entry in `key`'s queue waits, as `kind`, behind `ahead` (the entries
    /// before it, oldest first): a store that wakes waiters by watching particular entries
    /// (MySQL) watches those whose going may let it hold. Nothing by default: the others tell
    /// every deletion.
    fn waiting_behind(&self, _key: &str, _ahead: &[Entry<Self::Lease>], _kind: LockKind) {}

    /// Ends the store's notification links (the backend shut down).
    fn close(&self) {}

    /// The SQL schema of a database's lock tables (`None`: not a database).
    fn sql_schema(&self) -> Option<&str> {
        None
    }
}

/// A queue as a join read it, and where in the store's order the read happened.
#[derive(Debug)]
pub(crate) struct Read<L> {
    pub(crate) entries: Vec<Entry<L>>,
    pub(crate) at: u64,
}

/// What a leave or a renewal found of the caller's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Presence {
    /// There: deleted, or its time started again.
    Present,
    /// Gone (it lapsed, or an operator removed it); `held`: another entry is first in the
    /// queue.
    Absent { held: bool },
}

impl Presence {
    /// What a database's `leave` and `renew` answer: 1 there, 0 gone with the queue empty, -1
    /// gone with another entry there.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn from_code(found: i64) -> Presence {
        match found {
            1 => Presence::Present,
            found => Presence::Absent { held: found < 0 },
        }
    }
}

/// One deletion in a watched queue: whose entry, and where in the store's order it happened:
/// a deletion at a position after a read's ([`Read::at`]) happened after that read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Deletion {
    pub(crate) owner: String,
    pub(crate) at: u64,
}

/// The deletions of one watched queue.
pub(crate) type Deletions = BoxStream<'static, Deletion>;
