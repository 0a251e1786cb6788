//! The engine boundary: the trait every lock engine implements and the values it answers with.
//!
//! A leaf: it imports only leaves (owner tokens, release watches and successors, doctor findings,
//! the protocol's replies), never the
//! backend handle, the watchdog or anything else that sits above an engine. Engines are built by
//! their own constructors (`engines/`) and handed to a [`Backend`](crate::Backend).

use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Finding;
use crate::operating::key_events::{KeyEventSender, Notifications};
use crate::wait::{ReleaseWatch, Successor};
use futures_util::future::BoxFuture;
use std::time::Duration;

/// What an acquire attempt found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// The lock is ours, with this fencing token.
    Yes { fence: u64 },
    /// Another owner holds it for about `ttl` more (None when the server could not say).
    Busy {
        ttl: Option<Duration>,
        /// Not held, but left for `ttl` to the waiters a release notified (the caller was not
        /// one of them).
        reserved: bool,
        /// The caller is queued for the lock: a release hands the lock over to it when its turn
        /// comes (a grant on its [`ReleaseWatch`]), held for this long from some instant after this
        /// request was sent, until the new owner confirms it. `None`: an ordinary busy reply.
        next: Option<Duration>,
        /// Queued at the back with a new place: the caller had no live place in the queue. A
        /// caller that was queued before has lost its place since — its entry lapsed, or the
        /// lock was handed to it and lapsed unclaimed — so a handover message it may still
        /// receive is stale.
        anew: bool,
    },
    /// Granted by the primary, but fewer replicas than wanted acknowledged it within the
    /// timeout, so the engine released it again (a failover could have handed it to someone
    /// else).
    Unreplicated {
        acknowledged: u32,
        wanted: u32,
        timeout: Duration,
    },
}

impl Acquired {
    /// Another owner holds it for about `ttl` more.
    pub(crate) const fn busy(ttl: Option<Duration>) -> Acquired {
        Acquired::Busy {
            ttl,
            reserved: false,
            next: None,
            anew: false,
        }
    }

    /// Free, but left to the waiters a release notified for `left` more.
    pub(crate) const fn reserved(left: Option<Duration>) -> Acquired {
        Acquired::Busy {
            ttl: left,
            reserved: true,
            next: None,
            anew: false,
        }
    }

    /// Busy, the holder's time left `ttl`; the caller is queued, its place lasting `next`
    /// (`anew`: at the back, with a new place).
    pub(crate) const fn queued(ttl: Option<Duration>, next: Duration, anew: bool) -> Acquired {
        Acquired::Busy {
            ttl,
            reserved: false,
            next: Some(next),
            anew,
        }
    }
}

/// Who asks for a lock, which decides what a busy reply does on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Asker {
    /// A single try: a busy reply is final, so the lock is not marked as waited on (its release
    /// need not announce itself for this caller).
    Once,
    /// The first try of a caller that waits if the lock is busy: a busy reply marks the lock as
    /// waited on.
    WillWait,
    /// A caller told "busy" before, still waiting: a lock its holder just released to the
    /// waiters it notified is this caller's as much as theirs, while first tries must wait a
    /// moment (so that the releasing process's next task, whose acquire follows the release on
    /// its connection, cannot take the lock from the waiters of other processes every time).
    Waiting,
}

/// What a release knows of the value its lock was granted as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GrantedAs {
    /// An exclusive lock granted with `fence` on its caller's first try, when nobody was told it
    /// is busy: unless someone waited since, the key still holds exactly what the grant wrote,
    /// and an engine may release it with one conditional write (`SET … IFEQ`) instead of a
    /// script.
    Quietly { fence: u64 },
    /// Anything else (a waiter's grant, a lost acquire reply, a reader or a permit): the engine
    /// releases it the general way.
    Unknown,
}

/// What a release or a renewal found on the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ownership {
    /// Ours: released or renewed.
    Ours,
    /// The key is gone (expired, deleted).
    Gone,
    /// Another owner holds the key (it was taken over: force-unlocked, or expired and acquired).
    TakenOver,
}

/// What a release that names a local successor did ([`Engine::transfer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transfer {
    /// The lock is the successor's now, with this fencing token.
    Granted { fence: u64 },
    /// Handed over to another process's queued waiter; the successor is queued for it, at the
    /// back (with its pledged owner token, for the engine's grant time): it waits
    /// for the handover without asking first. `grant`: how long that place, and a lock handed
    /// over to it, lasts unless the successor asks (or confirms).
    Queued { grant: Duration },
    /// Not transferred (others wait for the lock, or the engine does not transfer): released
    /// as [`Engine::release`] would have, with what it found.
    Released(Ownership),
}

/// One lease in a batched renewal.
#[derive(Clone, Copy)]
pub(crate) struct Renewal<'a> {
    pub(crate) key: &'a str,
    pub(crate) owner: &'a Owner,
    pub(crate) ttl: Duration,
    /// A shared holder (reader, permit) renews its own lease among the key's holders.
    pub(crate) kind: LockKind,
}

/// Who holds a lock, as [`Backend::inspect`](crate::Backend::inspect) reports it.
///
/// Its `Debug` output shows only the first six characters of the owner token, which is a
/// credential.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The holder's owner token. It is a credential (whoever has it can release the lock): keep
    /// it out of logs.
    pub owner: String,
    /// The fencing token issued to the holder.
    pub fencing_token: u64,
    /// How long the lock lives unless renewed.
    pub ttl: Duration,
    /// The holder's label ([`BackendBuilder::holder_label`](crate::BackendBuilder::holder_label):
    /// `hostname:pid` by default), written with the lock so operators can tell who holds it;
    /// `None` when the holder wrote none.
    pub label: Option<String>,
    /// `true` when a caller was told the lock is busy since it was taken (its release will
    /// announce itself).
    pub waited_on: bool,
    /// Processes waiting for the release: connections subscribed to the lock's release channel
    /// (one per process, however many of its tasks wait).
    /// `None` when the server would not count them (an ACL without `PUBSUB`).
    pub waiting: Option<u64>,
    /// For a read lock or a semaphore: how many hold it now (`owner` is then empty, `label` one
    /// holder's, `ttl` the longest-living holder's, `waited_on` whether a writer or a waiter
    /// waits — on Redlock, once a quorum of masters carries the writer's intent, which is when
    /// it holds new readers back). `None` for an exclusive lock.
    pub shared: Option<u64>,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let shown = self.owner.get(..6).unwrap_or("");
        f.debug_struct("Holder")
            .field("owner", &format_args!("{shown}…"))
            .field("fencing_token", &self.fencing_token)
            .field("ttl", &self.ttl)
            .field("label", &self.label)
            .field("waited_on", &self.waited_on)
            .field("waiting", &self.waiting)
            .field("shared", &self.shared)
            .finish()
    }
}

/// The kind of deployment a backend talks to, as [`Backend::deployment`](crate::Backend::deployment)
/// answers; its [`Display`](std::fmt::Display) (and [`as_str`](Self::as_str)) is what the CLI
/// prints and its JSON's `deployment` field holds.
///
/// ```
/// use distlock::{Backend, Deployment};
///
/// let backend = Backend::builder("redis-cluster://10.0.0.1:7000").build().unwrap();
/// assert_eq!(backend.deployment(), Deployment::Cluster);
/// assert_eq!(backend.deployment().to_string(), "cluster");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Deployment {
    /// `memory://`: the in-process backend.
    InProcess,
    /// One Redis server (`redis://`, `rediss://`, `unix://`), or a primary behind a stable
    /// address.
    Redis,
    /// The primary a Sentinel group names (`redis-sentinel://`).
    Sentinel,
    /// A Redis Cluster (`redis-cluster://`).
    Cluster,
    /// Redlock over independent Redis masters.
    Redlock,
    /// An etcd cluster (`etcd://`, feature `etcd`).
    Etcd,
    /// A PostgreSQL database (`postgres://`, feature `postgres`).
    Postgres,
    /// A MySQL or MariaDB database (`mysql://`, feature `mysql`).
    Mysql,
    /// A ZooKeeper ensemble (`zookeeper://`, feature `zookeeper`).
    Zookeeper,
}

impl Deployment {
    /// Its name: `in-process`, `redis`, `sentinel`, `cluster`, `redlock`, `etcd`, `postgres`,
    /// `mysql` or `zookeeper`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Deployment::InProcess => "in-process",
            Deployment::Redis => "redis",
            Deployment::Sentinel => "sentinel",
            Deployment::Cluster => "cluster",
            Deployment::Redlock => "redlock",
            Deployment::Etcd => "etcd",
            Deployment::Postgres => "postgres",
            Deployment::Mysql => "mysql",
            Deployment::Zookeeper => "zookeeper",
        }
    }
}

impl std::fmt::Display for Deployment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed engine operation, before the backend adds its name.
#[derive(Debug)]
pub(crate) struct EngineFailure {
    pub(crate) ambiguous: bool,
    pub(crate) source: Box<dyn std::error::Error + Send + Sync + 'static>,
}

pub(crate) type EngineResult<T> = Result<T, EngineFailure>;

impl EngineFailure {
    /// A failure after which the request may have taken effect, or that the next try may not
    /// meet (a timeout, a broken connection, an answer that makes no sense).
    pub(crate) fn ambiguous(what: impl std::fmt::Display) -> EngineFailure {
        EngineFailure {
            ambiguous: true,
            source: what.to_string().into(),
        }
    }

    /// A key used as a semaphore taken as a lock, or the reverse (`-3` from the scripts).
    pub(crate) fn kind_mismatch(key: &str, kind: LockKind) -> EngineFailure {
        EngineFailure {
            ambiguous: false,
            source: format!(
                "the key {key} is used as a lock of another kind than this {kind} lock (a \
                 semaphore and a read/write lock cannot share a key); give one of them another key"
            )
            .into(),
        }
    }
}

/// One lock engine: where locks live and how they are taken, renewed and released (one Redis,
/// Redlock over several, the in-process map). Every operation is atomic on each server it
/// touches (one script call per server).
///
/// # Cancel safety
/// Not cancel safe: a request already sent may still take effect.
/// A future of these methods dropped after its request left may still have its effect on the
/// server, exactly like a lost reply; callers treat both the same way (the acquire path
/// releases with the owner token, the release path finishes in the background).
pub(crate) trait Engine: Send + Sync + 'static {
    /// Take `key` for `owner` with a TTL, or find it busy. Already held by `owner`: refresh the TTL
    /// and return the token issued the first time (idempotent retry). `asker` says whether a busy
    /// reply ends the call, starts a wait, or continues one (see [`Asker`]).
    ///
    /// `kind` says how the key is shared: an exclusive lock (a writer), a reader, or a permit of
    /// a semaphore of `n`. A key held one way is busy for the others (a writer for readers and
    /// the reverse); a key used as a semaphore is an error for locks and the reverse.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> BoxFuture<'a, EngineResult<Acquired>>;

    /// Delete `key` if `owner` holds it (as `kind`), and notify waiters. `granted` says what
    /// the caller knows of the value it was granted; engines that cannot use it ignore it.
    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        kind: LockKind,
        granted: GrantedAs,
    ) -> BoxFuture<'a, EngineResult<Ownership>>;

    /// Whether [`transfer`](Self::transfer) can grant a lock to a local successor (one server
    /// whose grants need no acknowledgement); when not, it only releases.
    fn transfers(&self) -> bool {
        false
    }

    /// Whether a waiter handed the lock by a release (a handover message) must ask for it
    /// before it holds it, instead of holding it from the message on: where grants must be
    /// acknowledged by replicas, which a grant written inside a release never was.
    fn handovers_need_asking(&self) -> bool {
        false
    }

    /// Releases `owner`'s exclusive lock on `key` and, if nobody else was told it is busy,
    /// grants it in the same step to `successor` (a task of this process queued behind the
    /// holder) with a new fencing token — one round trip and one script per local transfer. A
    /// lock others wait for is released as [`release`](Self::release) does, and announced to
    /// them. Asked again after a lost reply, a transfer that ran answers `Granted` again.
    fn transfer<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        successor: &'a Successor,
    ) -> BoxFuture<'a, EngineResult<Transfer>> {
        let _ = successor;
        Box::pin(async move {
            let found = self
                .release(key, owner, LockKind::Exclusive, GrantedAs::Unknown)
                .await?;
            Ok(Transfer::Released(found))
        })
    }

    /// Renew many leases in one call; one answer per lease, in order: `None` when the engine
    /// could not decide for that lease (Redlock: no quorum either way), which the watchdog
    /// treats as a failed renewal to retry.
    fn renew<'a>(
        &'a self,
        batch: &'a [Renewal<'a>],
    ) -> BoxFuture<'a, EngineResult<Vec<Option<Ownership>>>>;

    /// Who holds `key` now.
    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>>;

    /// Registers for `key`'s release notifications; resolves once the registration is in force
    /// on the server, so a check made after it cannot miss a release (subscribe-before-check).
    /// A transient failure (timeout, broken connection) still returns the registration,
    /// unconfirmed, and the waiter's backoff carries it until it subscribes again; a permanent
    /// one (the server refuses the subscription, e.g. NOPERM) is an error, never a silent
    /// fallback to polling.
    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<ReleaseWatch>>;

    /// Whether a waiting writer's claim on the key — what holds new readers back — lapses
    /// unless the writer asks again within `WRITER_INTENT` (the Redis scripts' intent), so
    /// that a waiting writer must ask at least every `WRITER_RETRY`. `true` unless the engine
    /// says otherwise: a writer that asks more often than it must costs a request, one that
    /// asks too seldom is overtaken by readers. `false` where the claim lasts as long as the
    /// writer's place in the queue (the queue engine).
    fn writer_intent_lapses(&self) -> bool {
        true
    }

    /// `true` when every future of this engine is ready at its first poll (the in-process
    /// map): a release can then run right where a guard is dropped, with no task and no runtime.
    fn answers_at_once(&self) -> bool {
        false
    }

    /// Whether locks of `kind` can be taken here; the reason when not.
    fn supports(&self, _kind: LockKind) -> Result<(), String> {
        Ok(())
    }

    /// Server settings that weaken locks.
    fn doctor(&self) -> BoxFuture<'_, EngineResult<Vec<Finding>>>;

    /// The doctor's `acl` check alone: what the user may not do of what locks need, where the
    /// server lets it ask (`ACL DRYRUN`); an `unchecked` finding where it does not.
    fn rights(&self) -> BoxFuture<'_, Vec<Finding>> {
        Box::pin(async { Vec::new() })
    }

    /// The SQL schema of a database engine's lock tables (`None`: not a database), which a
    /// fenced write in the application's own transaction reads.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    fn sql_schema(&self) -> Option<&str> {
        None
    }

    /// Closes the release-notification links (the backend shut down): their connections end.
    /// A later subscription would open new ones.
    fn close_links(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Keys (without the prefix) under the prefix matching the glob `pattern` that may hold a
    /// lock: found with `SCAN` (never `KEYS`) on every server; free token markers are among them,
    /// the caller inspects each.
    fn list<'a>(&'a self, pattern: &'a str) -> BoxFuture<'a, EngineResult<Vec<String>>>;

    /// Removes `key`'s lock whoever holds it, leaving a token marker above its token and waking
    /// its waiters; the holder removed (`None`: it was free).
    fn force_unlock<'a>(&'a self, key: &'a str) -> BoxFuture<'a, EngineResult<Option<Holder>>>;

    /// Follows `key`'s keyspace notifications on every server holding it, sending them to
    /// `events` until nobody listens; resolves once the subscriptions are in force. Without
    /// notifications enabled on a server it fails naming the setting, unless told to enable
    /// them (then it adds the flags it needs to `notify-keyspace-events`).
    fn follow<'a>(
        &'a self,
        key: &'a str,
        notifications: Notifications,
        events: KeyEventSender,
    ) -> BoxFuture<'a, EngineResult<()>>;
}
