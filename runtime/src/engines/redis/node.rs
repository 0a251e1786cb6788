//! One Redis server as every Redis-based engine talks to it: a lazily opened, self-reconnecting
//! connection, scripts sent by SHA (the source on NOSCRIPT), and the lock scripts as typed calls.
//! The single-server engine is one node; Redlock is several.
//!
//! A node's server is either fixed (one address) or the primary a Sentinel group names, which
//! the node follows across failovers: a connection that fails, a server that answers `READONLY`
//! (a demoted primary) and a `+switch-master` announcement each make the next call ask the
//! sentinels again. With [`ReplicaAck`], the writes that grant or extend a lock are followed by
//! `WAIT` in the same round trip. A node can also be a whole Redis Cluster, through redis-rs's
//! cluster client, which routes each script call to the node owning its keys' slot (and follows
//! `MOVED`/`ASK`).

use super::alive::AliveFlag;
use super::conditional::{self, ConditionalSet, ContendedKeys};
use super::diagnose;
use super::handover_channel::HandoverChannel;
use super::sentinel::SentinelTarget;
pub(crate) use super::timeouts::Timeouts;
use super::tls::{self, TlsFiles};
use crate::engine::{
    Acquired, Asker, EngineFailure, EngineResult, GrantedAs, Holder, Ownership, Renewal, Transfer,
};
use crate::error::LockError;
use crate::key::KeyNames;
use crate::kind::LockKind;
use crate::owner::Owner;
use crate::scripts::{
    LuaScript, ACQUIRE, FENCE_WRITEBACK, INSPECT, RELEASE, RENEW, SHARED_ACQUIRE, SHARED_RELEASE,
    UNLOCK,
};
use crate::wait::Successor;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One lock of a batched acquire: its key (already prefixed), owner, lease TTL, and who asks.
#[derive(Debug, Clone)]
pub(crate) struct LockCall {
    pub(crate) lock: String,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) asker: Asker,
}

/// One lock of a batched release: its key (already prefixed), its owner, how it was granted
/// (a first-try grant can be released by a conditional `SET` where the server has one), and the
/// local task it is transferred to if nobody else waits for it.
#[derive(Debug, Clone)]
pub(crate) struct ReleaseCall {
    pub(crate) lock: String,
    pub(crate) owner: Owner,
    pub(crate) granted: GrantedAs,
    pub(crate) successor: Option<Successor>,
}

impl ReleaseCall {
    /// An ownership-checked release of `owner`'s lock, with nothing known of its grant.
    pub(crate) fn plain(lock: String, owner: Owner) -> ReleaseCall {
        ReleaseCall {
            lock,
            owner,
            granted: GrantedAs::Unknown,
            successor: None,
        }
    }

    /// `release.lua`'s argument for this lock: the owner token, followed by the successor's
    /// token and TTL for a transfer and, where the server records next waiters (`handoff`, the
    /// grant time), the successor's grant time, should the lock be handed over instead, and
    /// ` +` if the transfer may go ahead of another process's next waiter. A successor with no
    /// TTL names a transfer that may have run: the lock is released if either token holds it.
    fn script_arg(&self, handoff: Option<Duration>) -> std::borrow::Cow<'_, [u8]> {
        let Some(successor) = &self.successor else {
            return self.owner.as_bytes().into();
        };
        if successor.ttl.is_zero() {
            // Release whichever of the two tokens holds the lock (a transfer may have run).
            let arg = format!("{} {} 0", self.owner.as_str(), successor.owner.as_str());
            return arg.into_bytes().into();
        }
        let mut arg = format!(
            "{} {} {}",
            self.owner.as_str(),
            successor.owner.as_str(),
            successor.ttl.as_millis().max(1)
        );
        if let Some(grant) = handoff {
            use std::fmt::Write;
            let _ = write!(arg, " {}", grant_for(grant, successor.ttl).as_millis());
            if successor.ahead_of_waiter {
                arg.push_str(" +");
            }
        }
        arg.into_bytes().into()
    }
}

/// A next waiter's grant time for a lease of `ttl` where the engine's is `grant`, as the
/// scripts compute it: the smaller of the two, in whole milliseconds.
pub(crate) fn grant_for(grant: Duration, ttl: Duration) -> Duration {
    let grant_ms = grant.as_millis().max(1);
    let ttl_ms = ttl.as_millis().max(1);
    Duration::from_millis(grant_ms.min(ttl_ms) as u64)
}

/// How long the waiters a release notifies have the lock before anyone else (`release.lua`):
/// enough for a notification and an acquire round trip on a busy machine, short enough that a
/// notified waiter that vanished leaves the lock idle only briefly.
pub(crate) const HANDOFF_WINDOW: Duration = Duration::from_millis(10);

/// The handoff window in force: [`HANDOFF_WINDOW`], unless a test hook set another.
pub(crate) fn handoff_window(hooks: &crate::hooks::SharedHooks) -> Duration {
    match crate::hooks::read(hooks).handoff_window {
        Duration::ZERO => HANDOFF_WINDOW,
        set => set,
    }
}

/// Replica acknowledgement: the writes that grant or renew a lock are confirmed by this many
/// replicas (`WAIT replicas timeout`) before the lock counts as granted or renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    /// How long the marker of a grant taken back stays (the backend's `fence_counter_ttl`).
    pub(crate) marker_ttl: Duration,
}

/// What the release script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    Found(Ownership),
    /// Released, but the server refused the notification (the user may not publish).
    ReleasedUnannounced,
    /// Transferred to the call's successor, which holds it with this token.
    Transferred {
        fence: u64,
    },
    /// Handed over to another process's next waiter, with the call's successor recorded as the
    /// next waiter after it, for this grant time.
    Queued {
        grant: Duration,
    },
}

pub(crate) struct Node {
    target: Target,
    /// The key prefix, for advice in errors (the ACL rules to grant).
    prefix: String,
    timeouts: Timeouts,
    replica_ack: Option<ReplicaAck>,
    /// How long a lock handed over to its next waiter is held before the waiter confirms it
    /// (`acquire.lua`'s `:next`); `None`: no next waiter is recorded (Redlock; replica
    /// acknowledgement, which a grant inside a release would skip).
    handoff: Option<Duration>,
    /// How a release announces itself: `PUBLISH`, or `SPUBLISH` (sharded, Redis Cluster).
    publish: &'static str,
    /// The holder label written with every lock (empty: none).
    label: Vec<u8>,
    /// Where handovers to this process's waiters are announced (`None`: on the key's channel).
    handover_channel: Option<Arc<HandoverChannel>>,
    /// Keys whose conditional release found them waited on lately: released by script.
    contended: ContendedKeys,
    connection: Mutex<Option<Bound>>,
    /// One connection attempt at a time.
    opening: tokio::sync::Mutex<()>,
    /// Connection attempts that failed slowly (the sentinels or the cluster did not answer in
    /// time), so that callers that waited behind one fail with it instead of each waiting as
    /// long again. A quick failure (a refused connection, a sentinel naming a server that is no
    /// longer primary mid-failover) is tried again by the next caller.
    slow_failures: std::sync::atomic::AtomicU64,
    /// Cleared when the tokio runtime this node's connections are bound to shuts down; one
    /// per runtime, not one per connection.
    runtime: Mutex<Option<Arc<AtomicBool>>>,
    /// Numbers the connections, so that a failure drops only the connection it happened on.
    next_id: std::sync::atomic::AtomicU64,
}

/// Which server a node talks to.
enum Target {
    /// One address.
    Fixed(Box<redis::Client>),
    /// Whichever server the sentinels name as the group's primary.
    Sentinel(Arc<SentinelTarget>),
    /// A Redis Cluster: each call goes to the node owning its keys' slot.
    Cluster(Box<ClusterClient>),
}

/// A connection to one server, or to a cluster.
#[derive(Clone)]
pub(crate) enum Conn {
    Server(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a redis::Cmd) -> redis::RedisFuture<'a, Value> {
        match self {
            Conn::Server(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

/// A connection bound to the tokio runtime that opened it. Its background tasks die with that
/// runtime (a test's runtime, say); `alive` notices, and the next call opens a new one.
#[derive(Clone)]
struct Bound {
    id: u64,
    conn: Conn,
    /// The server's client, for connections of other kinds (pub/sub); shared, so that taking
    /// the connection for a call allocates nothing. `None` for a cluster.
    client: Option<Arc<redis::Client>>,
    alive: Arc<AtomicBool>,
    /// The Sentinel generation the server was named in (0 for a fixed server).
    generation: u64,
    /// Whether this connection's server has `SET … IFEQ` (learned by using it).
    conditional_set: Arc<ConditionalSet>,
}

impl Node {
    /// A node for the server at `url` (connected on first use).
    pub(crate) fn open(
        url: &str,
        tls: &TlsFiles,
        timeouts: Timeouts,
        prefix: &str,
    ) -> Result<Node, LockError> {
        let client = tls::client(url, tls)?;
        Ok(Node::new(Target::Fixed(Box::new(client)), timeouts, prefix))
    }

    /// A node for the primary of a Sentinel group (found on first use, followed across
    /// failovers).
    pub(crate) fn sentinel(target: Arc<SentinelTarget>, timeouts: Timeouts, prefix: &str) -> Node {
        Node::new(Target::Sentinel(target), timeouts, prefix)
    }

    /// A node for a whole Redis Cluster (connected on first use); releases announce themselves
    /// with `SPUBLISH`, on the shard that owns the lock's slot.
    pub(crate) fn cluster(client: ClusterClient, timeouts: Timeouts, prefix: &str) -> Node {
        Node::new(Target::Cluster(Box::new(client)), timeouts, prefix)
    }

    fn new(target: Target, timeouts: Timeouts, prefix: &str) -> Node {
        let publish = match target {
            Target::Cluster(_) => "SPUBLISH",
            _ => "PUBLISH",
        };
        Node {
            target,
            prefix: prefix.to_owned(),
            timeouts,
            replica_ack: None,
            handoff: None,
            publish,
            label: Vec::new(),
            handover_channel: None,
            contended: ContendedKeys::default(),
            connection: Mutex::new(None),
            opening: tokio::sync::Mutex::new(()),
            slow_failures: std::sync::atomic::AtomicU64::new(0),
            runtime: Mutex::new(None),
            next_id: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The cluster connection (opened if needed), for calls routed by the cluster engine itself.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the connection attempt; nothing is left half done.
    pub(crate) async fn cluster_connection(&self) -> EngineResult<ClusterConnection> {
        match self.connection().await?.conn {
            Conn::Cluster(conn) => Ok(conn),
            Conn::Server(_) => Err(unexpected("cluster_connection", "not a cluster node")),
        }
    }

    /// Every lock this node takes carries `label` (see `acquire.lua`).
    pub(crate) fn with_label(mut self, label: &str) -> Node {
        self.label = label.as_bytes().to_vec();
        self
    }

    /// Grants and renewals wait for `ack` replicas (`None`: they do not wait).
    pub(crate) fn with_replica_ack(mut self, ack: Option<ReplicaAck>) -> Node {
        self.replica_ack = ack;
        self
    }

    /// A waited-on lock's release hands it over to its next waiter, held for `grant` until the
    /// waiter confirms it — unless grants wait for replicas, which a handover would not.
    pub(crate) fn with_handoff(mut self, grant: Duration) -> Node {
        self.handoff = Some(grant).filter(|_| self.replica_ack.is_none());
        self
    }

    /// Handovers to this process's waiters are announced on `channel`, which the node's
    /// subscriber listens to (see [`HandoverChannel`]); only where next waiters are recorded.
    pub(crate) fn with_handover_channel(mut self, channel: Arc<HandoverChannel>) -> Node {
        self.handover_channel = Some(channel).filter(|_| self.handoff.is_some());
        self
    }

    /// The channel handovers to this process's waiters are announced on, if it has one.
    pub(crate) fn handover_channel(&self) -> Option<&HandoverChannel> {
        self.handover_channel.as_deref()
    }

    /// Whether a release may grant the lock to someone in the same step (a handover to the next
    /// waiter, a local transfer): not with replica acknowledgement, whose grants must each be
    /// acknowledged, nor on Redlock's masters, which must each decide alike.
    pub(crate) fn grants_in_release(&self) -> bool {
        self.handoff.is_some()
    }

    /// The client of the server this node talks to now (for Sentinel: the primary the sentinels
    /// name, asked for if no connection is open), for connections of other kinds (pub/sub).
    ///
    /// # Cancel safety
    /// Dropping the future abandons the lookup; nothing is left half done.
    pub(crate) async fn current_client(&self) -> Result<redis::Client, redis::RedisError> {
        match self.connection().await {
            Ok(Bound {
                client: Some(client),
                ..
            }) => Ok((*client).clone()),
            Ok(_) => Err(redis::RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "a cluster has no single server to open a connection to",
            ))),
            Err(failure) => Err(no_connection(failure)),
        }
    }

    /// The lock keys (without the prefix) matching `pattern` on this server (not a cluster).
    ///
    /// # Cancel safety
    /// Read-only (`SCAN`): dropping the future changes nothing.
    pub(crate) async fn scan(&self, pattern: &str) -> EngineResult<Vec<String>> {
        let pattern = super::scan::match_pattern(&self.prefix, pattern);
        let locks = super::scan::walk(&pattern, |cmd| async move { self.raw_query(&cmd).await })
            .await
            .map_err(|err| self.failure(err))?;
        Ok(locks
            .iter()
            .filter_map(|lock| super::scan::key_of(&self.prefix, lock))
            .map(str::to_owned)
            .collect())
    }

    /// The connection timeouts, for connections the node does not own (keyspace followers).
    pub(crate) fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// Opens clients to the server this node talks to at the time of each call (for Sentinel:
    /// the primary named then), for keyspace followers.
    pub(crate) fn client_source(self: &Arc<Self>) -> super::keyspace::ClientSource {
        let node = Arc::downgrade(self);
        Arc::new(move || {
            let node = node.clone();
            Box::pin(async move {
                match node.upgrade() {
                    Some(node) => node.current_client().await,
                    None => Err(redis::RedisError::from((
                        redis::ErrorKind::Io,
                        "the backend was dropped",
                    ))),
                }
            })
        })
    }

    /// `host:port` of the server (for Sentinel: the group), for messages.
    pub(crate) fn address(&self) -> String {
        match &self.target {
            Target::Fixed(client) => client.get_connection_info().addr().to_string(),
            Target::Sentinel(target) => target.describe(),
            Target::Cluster(_) => "the cluster".to_owned(),
        }
    }

    /// The open connection, or a new one (for Sentinel: to the primary the sentinels name now).
    /// One attempt at a time: callers that arrive meanwhile take its connection, or its failure
    /// if it failed slowly.
    ///
    /// # Cancel safety
    /// Dropping the future abandons an attempt in progress (the next caller makes a new one);
    /// nothing is left half open.
    async fn connection(&self) -> EngineResult<Bound> {
        if let Some(bound) = self.live() {
            return Ok(bound);
        }
        let slow_failures_seen = self.slow_failures.load(Ordering::Acquire);
        let _one_at_a_time = self.opening.lock().await;
        if let Some(bound) = self.live() {
            return Ok(bound);
        }
        if self.slow_failures.load(Ordering::Acquire) != slow_failures_seen {
            return Err(EngineFailure {
                ambiguous: false,
                source: format!(
                    "{}: the connection attempt just made timed out",
                    self.address()
                )
                .into(),
            });
        }
        let started = std::time::Instant::now();
        let opened = self.open_connection().await;
        if opened.is_err() && started.elapsed() >= self.timeouts.connect {
            self.slow_failures.fetch_add(1, Ordering::AcqRel);
        }
        opened
    }

    /// Opens a connection to the fixed server, the primary the sentinels name now, or the cluster,
    /// and makes it the node's connection.
    ///
    /// # Cancel safety
    /// Dropping the future abandons the attempt (the Sentinel lookup, the cluster connection); a
    /// connection is kept only once made, so nothing is left half open.
    async fn open_connection(&self) -> EngineResult<Bound> {
        let (client, generation) = match &self.target {
            Target::Cluster(client) => return self.bind_cluster(client).await,
            Target::Fixed(client) => ((**client).clone(), 0),
            Target::Sentinel(target) => target.resolve().await.map_err(|err| EngineFailure {
                ambiguous: false,
                source: format!("{}: {err}", target.describe()).into(),
            })?,
        };
        self.bind(client, generation)
    }

    fn live(&self) -> Option<Bound> {
        let slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        let bound = slot.as_ref()?;
        let current = match &self.target {
            Target::Fixed(_) | Target::Cluster(_) => 0,
            Target::Sentinel(target) => target.generation(),
        };
        (bound.alive.load(Ordering::Acquire) && bound.generation == current).then(|| bound.clone())
    }

    /// After a failed call on `bound`: a Sentinel node whose server is unreachable or no longer
    /// the primary drops the connection, so the next call asks the sentinels again. (A fixed
    /// server's connection reconnects by itself.)
    fn after_failure(&self, bound: &Bound, err: &redis::RedisError) {
        if !matches!(self.target, Target::Sentinel(_)) {
            return;
        }
        if !primary_may_have_moved(err) {
            return;
        }
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if slot.as_ref().is_some_and(|current| current.id == bound.id) {
            *slot = None;
        }
    }

    fn bind(&self, client: redis::Client, generation: u64) -> EngineResult<Bound> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeouts.response))
            .set_connection_timeout(Some(self.timeouts.connect))
            // Reconnect quickly, but give up soon enough that an unreachable server is an error
            // within a few connect timeouts, not a hang.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250));
        let manager = ConnectionManager::new_lazy_with_config(client.clone(), config)
            .map_err(|err| self.failure(err))?;
        Ok(self.keep(Conn::Server(manager), Some(Arc::new(client)), generation))
    }

    /// Connects to the cluster (one reachable node is enough; the others are found from it).
    ///
    /// # Cancel safety
    /// Dropping the future drops the connection being made; the node keeps nothing of it.
    async fn bind_cluster(&self, client: &ClusterClient) -> EngineResult<Bound> {
        let connect = client.get_async_connection();
        let conn = match tokio::time::timeout(self.timeouts.connect * 2, connect).await {
            Ok(conn) => conn.map_err(|err| self.failure(err))?,
            Err(_) => {
                return Err(EngineFailure {
                    ambiguous: false,
                    source: "no cluster node answered in time".into(),
                })
            }
        };
        Ok(self.keep(Conn::Cluster(conn), None, 0))
    }

    /// Makes `conn` the node's connection.
    fn keep(&self, conn: Conn, client: Option<Arc<redis::Client>>, generation: u64) -> Bound {
        let bound = Bound {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            conn,
            client,
            alive: self.runtime_flag(),
            generation,
            conditional_set: Arc::default(),
        };
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        *slot = Some(bound.clone());
        bound
    }

    /// The flag of the current runtime: cleared when it shuts down (and with it the tasks of
    /// every connection opened on it). Made once per runtime.
    fn runtime_flag(&self) -> Arc<AtomicBool> {
        let mut current = self.runtime.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(flag) = current.as_ref().filter(|flag| flag.load(Ordering::Acquire)) {
            return flag.clone();
        }
        let alive = Arc::new(AtomicBool::new(true));
        let flag = AliveFlag(alive.clone());
        tokio::spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        *current = Some(alive.clone());
        alive
    }

    /// Runs `script` by SHA; on NOSCRIPT (first use, restarted server) sends its source.
    ///
    /// # Cancel safety
    /// Dropping the future after the command was written does not unsend it: the script may
    /// still run. Callers that must know (acquire, release) keep what is needed to undo or
    /// finish it — see `acquire.rs` and `release.rs`.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&[u8]],
    ) -> EngineResult<T> {
        let (reply, _) = self.invoke_acked(script, keys, args, None).await?;
        Ok(reply)
    }

    /// [`invoke`](Self::invoke), followed in the same round trip by `WAIT` when `ack` is set:
    /// the reply and how many replicas acknowledged the script's writes.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke).
    async fn invoke_acked<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&[u8]],
        ack: Option<ReplicaAck>,
    ) -> EngineResult<(T, Option<u32>)> {
        let bound = self.connection().await?;
        let mut conn = bound.conn.clone();
        let sent = match send(&mut conn, script.evalsha(keys, args), ack).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                send(&mut conn, script.eval(keys, args), ack).await
            }
            other => other,
        };
        let (reply, acknowledged) = sent.map_err(|err| {
            // A reply late behind a WAIT (replicas slow to acknowledge block the connection on
            // the server) says nothing about where the primary is.
            if !(ack.is_some() && err.is_timeout()) {
                self.after_failure(&bound, &err);
            }
            self.failure(err)
        })?;
        let reply = T::from_redis_value(reply).map_err(|err| EngineFailure {
            ambiguous: false,
            source: format!("unexpected reply to a lock script: {err}").into(),
        })?;
        Ok((reply, acknowledged))
    }

    fn failure(&self, err: redis::RedisError) -> EngineFailure {
        diagnose::failure(err, &self.prefix)
    }

    /// `acquire.lua` for one lock: take it (or find it busy, and mark it waited on); the token is
    /// this server's, with its clock counted in steps of `clock_step_us` (1 for µs).
    ///
    /// # Cancel safety
    /// As [`acquire_many`](Self::acquire_many): a dropped call may hold the lock; the caller
    /// releases it with the same owner.
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        owner: &Owner,
        ttl: Duration,
        clock_step_us: u32,
        asker: Asker,
    ) -> EngineResult<Acquired> {
        let item = LockCall {
            lock: names.lock.clone(),
            owner: owner.clone(),
            ttl,
            asker,
        };
        let mut answers = self
            .acquire_many(std::slice::from_ref(&item), clock_step_us)
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("acquire", "no answer"))?
    }

    /// `acquire.lua` for a batch of locks (already prefixed): one answer per lock. A lock whose
    /// key holds a value distlock did not write is answered with its own error; the others are
    /// unaffected.
    ///
    /// With [`ReplicaAck`], the script is followed by `WAIT` in the same round trip, and grants
    /// the replicas did not acknowledge are released again before the answer
    /// ([`Acquired::Unreplicated`]).
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): a dropped call may have taken its locks; the callers release
    /// them with the owner tokens they keep (`acquire.rs`, `batches.rs`).
    pub(crate) async fn acquire_many(
        &self,
        items: &[LockCall],
        clock_step_us: u32,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        let step = clock_step_us.to_string();
        let ttls: Vec<Vec<u8>> = items.iter().map(|item| millis(item.ttl)).collect();
        let handoff = self.handoff_arg();
        let mut args: Vec<&[u8]> = Vec::with_capacity(3 + 3 * items.len());
        args.push(step.as_bytes());
        args.push(&self.label);
        args.push(&handoff);
        for (item, ttl) in items.iter().zip(&ttls) {
            args.push(item.owner.as_bytes());
            args.push(ttl);
            args.push(asker_code(item.asker));
        }
        let (reply, acknowledged): (Vec<i64>, _) = self
            .invoke_acked(&ACQUIRE, &keys, &args, self.replica_ack)
            .await?;
        if reply.len() != 2 * items.len() {
            return Err(unexpected("acquire", reply));
        }
        let answers: Vec<EngineResult<Acquired>> = reply
            .chunks_exact(2)
            .zip(items)
            .map(|(answer, item)| match *answer {
                [1, fence] if fence > 0 => Ok(Acquired::Yes {
                    fence: fence as u64,
                }),
                [0, pttl] => Ok(Acquired::Busy {
                    ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                    reserved: false,
                    next: None,
                }),
                [4, pttl] => Ok(Acquired::Busy {
                    ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                    reserved: false,
                    next: self.handoff.map(|grant| grant_for(grant, item.ttl)),
                }),
                [3, left] => Ok(Acquired::Busy {
                    ttl: u64::try_from(left).ok().map(Duration::from_millis),
                    reserved: true,
                    next: None,
                }),
                [-2, _] => Err(EngineFailure {
                    ambiguous: false,
                    source: diagnose::foreign_value(&format!("the key {}", item.lock)).into(),
                }),
                [-3, _] => Err(EngineFailure::kind_mismatch(
                    &item.lock,
                    LockKind::Exclusive,
                )),
                _ => Err(unexpected("acquire", answer)),
            })
            .collect();
        match (self.replica_ack, acknowledged) {
            (Some(ack), Some(acknowledged)) if acknowledged < ack.replicas => Ok(self
                .take_back_unreplicated(items, answers, ack, acknowledged)
                .await),
            _ => Ok(answers),
        }
    }

    /// Grants that fewer replicas than wanted acknowledged are released at once (a failover now
    /// could hand them to someone else) and answered [`Acquired::Unreplicated`]. A grant whose
    /// release fails is answered with that failure, ambiguous: the caller's cleanup releases it
    /// again with the same owner.
    ///
    /// # Cancel safety
    /// Dropped before the release answered, the grants may still be held: the caller's acquire
    /// is still in flight then (`acquire.rs`), and its cleanup releases them with the same owner.
    async fn take_back_unreplicated(
        &self,
        items: &[LockCall],
        answers: Vec<EngineResult<Acquired>>,
        ack: ReplicaAck,
        acknowledged: u32,
    ) -> Vec<EngineResult<Acquired>> {
        let granted: Vec<ReleaseCall> = items
            .iter()
            .zip(&answers)
            .filter(|(_, answer)| matches!(answer, Ok(Acquired::Yes { .. })))
            .map(|(item, _)| ReleaseCall::plain(item.lock.clone(), item.owner.clone()))
            .collect();
        if granted.is_empty() {
            return answers;
        }
        // The marker keeps the token granted (and taken back) as the one the next must exceed.
        let released = self
            .release_by_script(&granted, ack.marker_ttl, HANDOFF_WINDOW)
            .await;
        let unreplicated = Acquired::Unreplicated {
            acknowledged,
            wanted: ack.replicas,
            timeout: ack.timeout,
        };
        answers
            .into_iter()
            .map(|answer| match (answer, &released) {
                (Ok(Acquired::Yes { .. }), Ok(_)) => Ok(unreplicated),
                (Ok(Acquired::Yes { .. }), Err(failure)) => Err(EngineFailure {
                    ambiguous: true,
                    source: format!(
                        "{acknowledged} of {} replicas acknowledged the lock, and releasing it \
                         failed: {}",
                        ack.replicas, failure.source
                    )
                    .into(),
                }),
                (other, _) => other,
            })
            .collect()
    }

    /// `fence_writeback.lua`: record `fence` as the lock's token (and so, after the release, as
    /// the marker the next token must exceed) where `owner` still holds the lock. `true` when it
    /// did.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): a write-back already sent may still record `fence` where
    /// `owner` holds the lock; its acquire is still in flight then, and that acquire's cleanup
    /// releases with the same owner.
    pub(crate) async fn write_back_fence(
        &self,
        names: &KeyNames,
        owner: &Owner,
        fence: u64,
        kind: LockKind,
    ) -> EngineResult<bool> {
        let who = match kind.is_shared() {
            true => [&b"~"[..], &self.member(owner)].concat(),
            false => owner.as_bytes().to_vec(),
        };
        let done: i64 = self
            .invoke(
                &FENCE_WRITEBACK,
                &[&names.lock],
                &[&who, fence.to_string().as_bytes()],
            )
            .await?;
        Ok(done == 1)
    }

    /// Releases one lock: free it if `owner` holds it, leaving its token as a marker for
    /// `fence_counter_ttl`, and announce it if anyone waits ([`release_calls`](Self::release_calls)).
    ///
    /// # Cancel safety
    /// As [`release_calls`](Self::release_calls).
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        owner: &Owner,
        granted: GrantedAs,
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = ReleaseCall {
            granted,
            ..ReleaseCall::plain(names.lock.clone(), owner.clone())
        };
        self.release_call(item, fence_counter_ttl, handoff_window)
            .await
    }

    /// Releases `owner`'s lock and transfers it to `successor` in the same script unless
    /// others wait for it (`release.lua`).
    ///
    /// # Cancel safety
    /// As [`release_by_script`](Self::release_by_script): dropped after sending, the lock may
    /// be transferred all the same; asked again, a transfer that ran answers again.
    pub(crate) async fn transfer(
        &self,
        names: &KeyNames,
        owner: &Owner,
        successor: &Successor,
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = ReleaseCall {
            successor: Some(successor.clone()),
            ..ReleaseCall::plain(names.lock.clone(), owner.clone())
        };
        self.release_call(item, fence_counter_ttl, handoff_window)
            .await
    }

    /// [`release_calls`](Self::release_calls) for one lock: its answer.
    ///
    /// # Cancel safety
    /// As [`release_calls`](Self::release_calls).
    async fn release_call(
        &self,
        item: ReleaseCall,
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let mut answers = self
            .release_calls(
                std::slice::from_ref(&item),
                fence_counter_ttl,
                handoff_window,
            )
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("release", "no answer"))
    }

    /// Releases a batch of exclusive locks (already prefixed), one answer each, in one round trip
    /// where it can: the locks granted quietly with one conditional `SET … IFEQ` each where the
    /// server has it ([`conditional`]), the others by `release.lua` in the same pipeline. A
    /// conditional write that does not find the lock as granted (waited on, expired, taken over)
    /// is followed by `release.lua` for that lock, which notifies its waiters and tells which.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): dropped after sending, some locks may be released; the
    /// caller finishes the release in the background (`release.rs`), where a lock already
    /// released reads as gone.
    pub(crate) async fn release_calls(
        &self,
        items: &[ReleaseCall],
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        // By index: the locks a conditional write may release, with their tokens, and the rest.
        let (mut quiet, mut scripted): (Vec<(usize, u64)>, Vec<usize>) = (Vec::new(), Vec::new());
        for (index, item) in items.iter().enumerate() {
            match item.granted {
                GrantedAs::Quietly { fence }
                    if item.successor.is_none() && !self.contended.contains(&item.lock) =>
                {
                    quiet.push((index, fence));
                }
                _ => scripted.push(index),
            }
        }
        if quiet.is_empty() {
            return self
                .release_by_script(items, fence_counter_ttl, handoff_window)
                .await;
        }
        let bound = self.connection().await?;
        if !bound.conditional_set.usable() {
            return self
                .release_by_script(items, fence_counter_ttl, handoff_window)
                .await;
        }
        let mut answers: Vec<Option<ReleaseReply>> = vec![None; items.len()];
        let mut pipe = redis::pipe();
        for (index, fence) in &quiet {
            let item = &items[*index];
            pipe.add_command(conditional::release_command(
                &item.lock,
                *fence,
                &item.owner,
                &self.label,
                fence_counter_ttl,
            ));
        }
        let marker_ttl = millis(fence_counter_ttl);
        let window = millis(handoff_window);
        if !scripted.is_empty() {
            let keys: Vec<&str> = scripted.iter().map(|i| items[*i].lock.as_str()).collect();
            let owners: Vec<_> = scripted
                .iter()
                .map(|i| items[*i].script_arg(self.handoff))
                .collect();
            let args = self.release_args(&owners, &marker_ttl, &window);
            pipe.add_command(RELEASE.evalsha(&keys, &args));
        }
        let mut conn = bound.conn.clone();
        let replies: Vec<Value> =
            pipe.ignore_errors()
                .query_async(&mut conn)
                .await
                .map_err(|err| {
                    self.after_failure(&bound, &err);
                    self.failure(err)
                })?;
        if replies.len() != quiet.len() + usize::from(!scripted.is_empty()) {
            return Err(unexpected("release", replies));
        }
        let mut replies = replies.into_iter();
        for ((index, _), reply) in quiet.iter().zip(replies.by_ref()) {
            match conditional::outcome(&reply, &bound.conditional_set) {
                conditional::Outcome::Released => {
                    answers[*index] = Some(ReleaseReply::Found(Ownership::Ours));
                }
                conditional::Outcome::NotAsGranted => self.contended.note(&items[*index].lock),
                _ => {}
            }
        }
        // The script's answer; an error (NOSCRIPT on first use, say) sends its locks again below.
        let codes = replies
            .next()
            .and_then(|reply| reply.extract_error().ok())
            .and_then(|reply| Vec::<Value>::from_redis_value(reply).ok());
        if let Some(codes) = codes {
            let calls = scripted.iter().map(|i| &items[*i]);
            if let Ok(released) = release_replies(codes, calls, self.handoff) {
                for (index, answer) in scripted.iter().zip(released) {
                    answers[*index] = Some(answer);
                }
            }
        }
        let released_already = answers.iter().any(Option::is_some);
        let rest: Vec<usize> = (0..items.len()).filter(|i| answers[*i].is_none()).collect();
        if !rest.is_empty() {
            let pending: Vec<ReleaseCall> = rest.iter().map(|i| items[*i].clone()).collect();
            let again = self
                .release_by_script(&pending, fence_counter_ttl, handoff_window)
                .await
                .map_err(|mut failure| {
                    // The batch's other locks were released: to their callers the failure must
                    // read as "may have run", so that a retry finding them gone counts as done.
                    failure.ambiguous |= released_already;
                    failure
                })?;
            for (index, answer) in rest.into_iter().zip(again) {
                answers[index] = Some(answer);
            }
        }
        answers
            .into_iter()
            .map(|answer| answer.ok_or_else(|| unexpected("release", "no answer")))
            .collect()
    }

    /// `acquire.lua`'s grant time of next waiters: `0` (none are recorded), or the milliseconds
    /// followed by this process's handover channel, if it has a usable one.
    fn handoff_arg(&self) -> Vec<u8> {
        let Some(grant) = self.handoff else {
            return b"0".to_vec();
        };
        let mut arg = millis(grant);
        if let Some(channel) = self.usable_handover_channel() {
            arg.push(b' ');
            arg.extend_from_slice(channel.as_bytes());
        }
        arg
    }

    fn usable_handover_channel(&self) -> Option<&str> {
        self.handover_channel
            .as_deref()
            .and_then(HandoverChannel::usable)
    }

    /// `release.lua`'s arguments for locks whose per-lock arguments are `owners`
    /// ([`ReleaseCall::script_arg`]).
    fn release_args<'a>(
        &'a self,
        owners: &'a [std::borrow::Cow<'a, [u8]>],
        marker_ttl: &'a [u8],
        window: &'a [u8],
    ) -> Vec<&'a [u8]> {
        let mut args: Vec<&[u8]> = Vec::with_capacity(4 + owners.len());
        args.push(marker_ttl);
        args.push(window);
        args.push(self.publish.as_bytes());
        args.push(self.usable_handover_channel().unwrap_or("").as_bytes());
        args.extend(owners.iter().map(|owner| &**owner));
        args
    }

    /// `release.lua` for every one of `items` (locks already prefixed): one answer each. A lock
    /// that was waited on is left to the waiters it notifies for `handoff_window`; one that was
    /// not, and names a successor, is transferred to it.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): dropped after sending, the locks may be released (or
    /// transferred) all the same; callers that must know release again with the same owners,
    /// where a lock already released reads as gone and a transfer that ran answers again.
    pub(crate) async fn release_by_script(
        &self,
        items: &[ReleaseCall],
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        let owners: Vec<_> = items
            .iter()
            .map(|item| item.script_arg(self.handoff))
            .collect();
        let marker_ttl = millis(fence_counter_ttl);
        let window = millis(handoff_window);
        let args = self.release_args(&owners, &marker_ttl, &window);
        let codes: Vec<Value> = self.invoke(&RELEASE, &keys, &args).await?;
        release_replies(codes, items.iter(), self.handoff)
    }

    /// `shared_acquire.lua`: a reader or a permit of `lock` (already prefixed) for `owner`. With
    /// replica acknowledgement, a grant the replicas did not confirm is released again
    /// ([`Acquired::Unreplicated`]).
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): a dropped call may hold the key; the caller's cleanup
    /// releases it with the same owner.
    pub(crate) async fn acquire_shared(
        &self,
        lock: &str,
        owner: &Owner,
        ttl: Duration,
        asker: Asker,
        kind: LockKind,
    ) -> EngineResult<Acquired> {
        let holders = crate::key::holders_of(lock);
        let (letter, permits) = match kind {
            LockKind::Permits(n) => ("M", n),
            _ => ("R", 0),
        };
        let permits = permits.to_string();
        let member = self.member(owner);
        let ttl_ms = millis(ttl);
        let args: [&[u8]; 5] = [
            letter.as_bytes(),
            permits.as_bytes(),
            &member,
            &ttl_ms,
            asker_code(asker),
        ];
        let (answer, acknowledged): ([i64; 2], _) = self
            .invoke_acked(&SHARED_ACQUIRE, &[lock, &holders], &args, self.replica_ack)
            .await?;
        let acquired = match answer {
            [1, fence] if fence > 0 => Acquired::Yes {
                fence: fence as u64,
            },
            [0, ms] => Acquired::Busy {
                next: None,
                ttl: u64::try_from(ms).ok().map(Duration::from_millis),
                reserved: false,
            },
            [3, ms] => Acquired::Busy {
                next: None,
                ttl: u64::try_from(ms).ok().map(Duration::from_millis),
                reserved: true,
            },
            [-2, _] => {
                return Err(EngineFailure {
                    ambiguous: false,
                    source: diagnose::foreign_value(&format!("the key {lock}")).into(),
                })
            }
            [-3, _] => return Err(EngineFailure::kind_mismatch(lock, kind)),
            _ => return Err(unexpected("shared acquire", answer)),
        };
        match (self.replica_ack, acknowledged, acquired) {
            (Some(ack), Some(acknowledged), Acquired::Yes { .. })
                if acknowledged < ack.replicas =>
            {
                self.release_shared(lock, owner, ack.marker_ttl, Duration::ZERO)
                    .await
                    .map_err(|failure| EngineFailure {
                        ambiguous: true,
                        source: failure.source,
                    })?;
                Ok(Acquired::Unreplicated {
                    acknowledged,
                    wanted: ack.replicas,
                    timeout: ack.timeout,
                })
            }
            _ => Ok(acquired),
        }
    }

    /// `shared_release.lua`: the reader or permit `owner` of `lock` (already prefixed) leaves.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): dropped after sending, the holder may have left all the same;
    /// the caller releases again with the same owner (`release.rs`, or an acquire's cleanup),
    /// where a holder already gone reads as gone.
    pub(crate) async fn release_shared(
        &self,
        lock: &str,
        owner: &Owner,
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let holders = crate::key::holders_of(lock);
        let member = self.member(owner);
        let marker_ttl = millis(fence_counter_ttl);
        let window = millis(handoff_window);
        let args: [&[u8]; 4] = [&member, &marker_ttl, &window, self.publish.as_bytes()];
        let code: i64 = self
            .invoke(&SHARED_RELEASE, &[lock, &holders], &args)
            .await?;
        Ok(match code {
            2 => ReleaseReply::ReleasedUnannounced,
            code => ReleaseReply::Found(ownership(code)),
        })
    }

    /// A shared holder's member among the key's holders: `<owner> <label>`.
    fn member(&self, owner: &Owner) -> Vec<u8> {
        let mut member = Vec::with_capacity(owner.as_bytes().len() + 1 + self.label.len());
        member.extend_from_slice(owner.as_bytes());
        member.push(b' ');
        member.extend_from_slice(&self.label);
        member
    }

    /// `renew.lua` for a batch whose keys are already prefixed: one answer per lease; `None` for
    /// a lease extended on the primary but not acknowledged by the replicas wanted.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): a renewal already sent may still extend the leases; the
    /// watchdog counts only confirmed renewals, so no lease relies on it.
    pub(crate) async fn renew(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
    ) -> EngineResult<Vec<Option<Ownership>>> {
        let keys: Vec<&str> = locks.iter().map(String::as_str).collect();
        let owned = self.renew_args(batch);
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        let (codes, acknowledged): (Vec<i64>, _) = self
            .invoke_acked(&RENEW, &keys, &args, self.replica_ack)
            .await?;
        if codes.len() != batch.len() {
            return Err(unexpected("renew", codes));
        }
        let confirmed = match (self.replica_ack, acknowledged) {
            (Some(ack), Some(acknowledged)) => acknowledged >= ack.replicas,
            _ => true,
        };
        Ok(codes
            .into_iter()
            .map(ownership)
            // An extension the replicas did not confirm is not one the lease may count on.
            .map(|found| (confirmed || found != Ownership::Ours).then_some(found))
            .collect())
    }

    /// The `renew.lua` call (by SHA) for leases whose keys are already prefixed, for callers
    /// that send it themselves (the cluster engine pipelines one per slot to each node).
    /// `with_source`: `EVAL` with the script's source, which also loads it on the node.
    pub(crate) fn renew_command(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
        with_source: bool,
    ) -> redis::Cmd {
        let keys: Vec<&str> = locks.iter().map(String::as_str).collect();
        let owned = self.renew_args(batch);
        let args: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
        if with_source {
            RENEW.eval(&keys, &args)
        } else {
            RENEW.evalsha(&keys, &args)
        }
    }

    /// The answers in a `renew.lua` reply for `count` leases; a server error (`MOVED`,
    /// `NOSCRIPT`, …) is the failure.
    pub(crate) fn renew_answers(reply: Value, count: usize) -> EngineResult<Vec<Ownership>> {
        let reply = reply.extract_error().map_err(|err| EngineFailure {
            ambiguous: false,
            source: err.into(),
        })?;
        let codes = Vec::<i64>::from_redis_value(reply)
            .map_err(|err| unexpected("renew", err.to_string()))?;
        if codes.len() != count {
            return Err(unexpected("renew", codes));
        }
        Ok(codes.into_iter().map(ownership).collect())
    }

    /// `inspect.lua`: who holds the lock on this server.
    ///
    /// # Cancel safety
    /// Read-only: dropping the future changes nothing.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> EngineResult<Option<Holder>> {
        let reply: Vec<Value> = self
            .invoke(&INSPECT, &[&names.lock], &[self.count_subscribers()])
            .await?;
        holder_from(reply, "inspect")
    }

    /// `unlock.lua`: removes the lock whoever holds it (an operator's forced unlock), leaving
    /// the token marker one above its token; the holder it removed.
    ///
    /// # Cancel safety
    /// As [`invoke`](Self::invoke): dropped after sending, the lock may still be removed and its
    /// waiters woken.
    pub(crate) async fn force_unlock(
        &self,
        names: &KeyNames,
        marker_ttl: Duration,
    ) -> EngineResult<Option<Holder>> {
        let marker_ttl = millis(marker_ttl);
        let args: [&[u8]; 3] = [
            &marker_ttl,
            self.publish.as_bytes(),
            self.count_subscribers(),
        ];
        let reply: Vec<Value> = self.invoke(&UNLOCK, &[&names.lock], &args).await?;
        holder_from(reply, "unlock")
    }

    /// The `PUBSUB` subcommand counting a release channel's subscribers.
    fn count_subscribers(&self) -> &'static [u8] {
        match self.publish {
            "SPUBLISH" => b"SHARDNUMSUB",
            _ => b"NUMSUB",
        }
    }

    /// The server settings the doctor judges: eviction policy, persistence, replication. A
    /// setting the server refuses to show (an ACL without `CONFIG`) is judged unchecked; a server
    /// that cannot be reached is the error.
    ///
    /// # Cancel safety
    /// Read-only (`CONFIG GET`, `INFO`, `ACL`): dropping the future changes nothing.
    pub(crate) async fn doctor(&self) -> EngineResult<Vec<crate::doctor::Finding>> {
        let mut settings = Vec::new();
        for setting in ["maxmemory-policy", "appendonly", "save"] {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(setting);
            let value = match self.raw_query::<Vec<String>>(&cmd).await {
                Ok(pairs) => pairs.get(1).cloned(),
                Err(err) if diagnose::is_permanent(&err) => None,
                Err(err) => return Err(self.failure(err)),
            };
            settings.push(value);
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let replication: String = self.raw_query(&info).await.unwrap_or_default();
        let mut findings = crate::doctor::judge(
            settings[0].as_deref(),
            settings[1].as_deref(),
            settings[2].as_deref(),
            &replication,
            self.replica_ack.map_or(0, |ack| ack.replicas),
        );
        let mut server = redis::cmd("INFO");
        server.arg("server");
        let server: String = self.raw_query(&server).await.unwrap_or_default();
        findings.extend(crate::doctor::judge_version(&server));
        findings.extend(self.check_acl().await);
        Ok(findings)
    }

    /// What the connection's user may not do of what locks need, asked with `ACL DRYRUN` (Redis
    /// ≥ 7.0, and a right of its own: without it the check is reported unchecked).
    ///
    /// # Cancel safety
    /// Read-only (`ACL WHOAMI`, `ACL DRYRUN`): dropping the future changes nothing.
    async fn check_acl(&self) -> Vec<crate::doctor::Finding> {
        let user: String = match self
            .raw_query(&redis::cmd("ACL").arg("WHOAMI").clone())
            .await
        {
            Ok(user) => user,
            Err(_) => return vec![crate::doctor::acl_unchecked("ACL WHOAMI")],
        };
        let lock = crate::key::lock_name(&self.prefix, "doctor-probe");
        let channel = crate::key::channel_of(&lock);
        let (publish, subscribe) = match self.publish {
            "SPUBLISH" => ("SPUBLISH", "SSUBSCRIBE"),
            _ => ("PUBLISH", "SUBSCRIBE"),
        };
        let mut needed: Vec<Vec<&str>> = vec![
            vec!["EVALSHA", ACQUIRE.sha(), "1", &lock],
            vec!["EVAL", "return 0", "1", &lock],
            vec!["GET", &lock],
            vec!["SET", &lock, "v", "PX", "1"],
            vec!["SETRANGE", &lock, "0", "W"],
            vec!["DEL", &lock],
            vec!["ZADD", &lock, "1", "m"],
            vec!["PEXPIRE", &lock, "1"],
            vec!["PTTL", &lock],
            vec!["TIME"],
            vec![publish, &channel, "m"],
            vec![subscribe, &channel],
        ];
        if self.replica_ack.is_some() {
            needed.push(vec!["WAIT", "1", "1"]);
        }
        let mut denied = Vec::new();
        for command in &needed {
            let mut dryrun = redis::cmd("ACL");
            dryrun.arg("DRYRUN").arg(&user).arg(command);
            match self.raw_query::<String>(&dryrun).await {
                Ok(answer) if answer == "OK" => {}
                Ok(answer) => denied.push(format!("{}: {answer}", command[0])),
                Err(_) => return vec![crate::doctor::acl_unchecked("ACL DRYRUN")],
            }
        }
        crate::doctor::judge_acl(&user, &denied, &self.prefix, self.publish == "SPUBLISH")
    }

    /// Sends `cmd` on the node's connection (a server, or a cluster routing it by its keys).
    ///
    /// # Cancel safety
    /// Dropped after sending, `cmd` may still run, as with a lost reply; the callers here send only
    /// read-only commands (`SCAN`, `CONFIG GET`, `INFO`, `ACL`).
    pub(crate) async fn raw_query<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let bound = self.connection().await.map_err(no_connection)?;
        let mut conn = bound.conn.clone();
        let reply = cmd.query_async(&mut conn).await;
        if let Err(err) = &reply {
            self.after_failure(&bound, err);
        }
        reply
    }
}

/// A holder as `inspect.lua` and `unlock.lua` describe it; an empty reply is a free lock.
fn holder_from(reply: Vec<Value>, script: &'static str) -> EngineResult<Option<Holder>> {
    if reply.is_empty() {
        return Ok(None);
    }
    let field = |index: usize| reply.get(index).cloned().unwrap_or(Value::Nil);
    let parsed = (|| {
        Some(Holder {
            owner: String::from_redis_value(field(0)).ok()?,
            fencing_token: u64::from_redis_value(field(1)).ok()?,
            ttl: Duration::from_millis(i64::from_redis_value(field(2)).ok()?.max(0) as u64),
            label: Some(String::from_redis_value(field(3)).ok()?).filter(|l| !l.is_empty()),
            waited_on: i64::from_redis_value(field(4)).ok()? == 1,
            waiting: u64::try_from(i64::from_redis_value(field(5)).ok()?).ok(),
            shared: match reply.get(6) {
                Some(count) => Some(u64::from_redis_value(count.clone()).ok()?),
                None => None,
            },
        })
    })();
    match parsed {
        Some(holder) => Ok(Some(holder)),
        None => Err(unexpected(script, reply)),
    }
}

/// What a release found, for one server's engine: a release the server could not announce is
/// reported (once per engine) and counts as done.
pub(crate) fn settle_release(
    reply: ReleaseReply,
    reported: &AtomicBool,
    prefix: &str,
    lock: &str,
) -> Ownership {
    match reply {
        ReleaseReply::Found(ownership) => ownership,
        ReleaseReply::ReleasedUnannounced => {
            report_refused_publish(reported, prefix, &crate::key::channel_of(lock));
            Ownership::Ours
        }
        // Only a call naming a successor is transferred or queued: ours until then.
        ReleaseReply::Transferred { .. } | ReleaseReply::Queued { .. } => Ownership::Ours,
    }
}

/// What a release naming a successor did, for one server's engine ([`settle_release`] when it
/// was not transferred).
pub(crate) fn settle_transfer(
    reply: ReleaseReply,
    reported: &AtomicBool,
    prefix: &str,
    lock: &str,
) -> Transfer {
    match reply {
        ReleaseReply::Transferred { fence } => Transfer::Granted { fence },
        ReleaseReply::Queued { grant } => Transfer::Queued { grant },
        reply => Transfer::Released(settle_release(reply, reported, prefix, lock)),
    }
}

/// The release script could not announce a release: say so, once per engine, loudly — the
/// release itself stands.
pub(crate) fn report_refused_publish(reported: &AtomicBool, prefix: &str, channel: &str) {
    if reported.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        target: "distlock::release",
        channel,
        prefix,
        "the server refused to publish a release notification (the Redis user may not \
         publish on the channel); releases still happen, but waiters in other processes learn \
         of them only by backoff. Grant the rules distlock::redis_acl_rules(prefix) returns"
    );
}

/// A connection that could not be opened, as the redis-rs error its callers handle.
fn no_connection(failure: EngineFailure) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "no connection",
        failure.source.to_string(),
    ))
}

/// Whether `err` may mean the server is no longer the primary: it is unreachable, dropped the
/// connection, did not answer, or refused a write as a replica (`READONLY`, a demoted primary).
fn primary_may_have_moved(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_refusal()
        || err.is_connection_dropped()
        || err.is_timeout()
        || err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly)
}

/// Sends `script`, followed by `WAIT` when `ack` is set, in one round trip.
///
/// # Cancel safety
/// Dropped after the commands were written, the script (and `WAIT`) may still run on the
/// server, as with a lost reply; see [`Node::invoke`].
async fn send(
    manager: &mut Conn,
    script: redis::Cmd,
    ack: Option<ReplicaAck>,
) -> redis::RedisResult<(Value, Option<u32>)> {
    let Some(ack) = ack else {
        return script.query_async(manager).await.map(|reply| (reply, None));
    };
    let mut pipe = redis::pipe();
    pipe.add_command(script)
        .cmd("WAIT")
        .arg(ack.replicas)
        .arg(ack.timeout.as_millis().max(1) as u64);
    let replies: Vec<Value> = pipe.ignore_errors().query_async(manager).await?;
    let mut replies = replies.into_iter();
    let (Some(reply), Some(acknowledged)) = (replies.next(), replies.next()) else {
        return Err(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "a script and WAIT were sent, and fewer than two replies came back",
        )));
    };
    let reply = reply.extract_error()?;
    let acknowledged = u32::from_redis_value(acknowledged.extract_error()?)?;
    Ok((reply, Some(acknowledged)))
}

/// `release.lua`'s answer for the locks of `calls`: a code each (`6`: handed over, the
/// successor queued behind with its grant time out of `handoff`), or `{5, fence}` for a transfer.
fn release_replies<'a>(
    codes: Vec<Value>,
    calls: impl ExactSizeIterator<Item = &'a ReleaseCall>,
    handoff: Option<Duration>,
) -> EngineResult<Vec<ReleaseReply>> {
    if codes.len() != calls.len() {
        return Err(unexpected("release", codes));
    }
    codes
        .into_iter()
        .zip(calls)
        .map(|(code, call)| match code {
            Value::Int(2) => Ok(ReleaseReply::ReleasedUnannounced),
            Value::Int(6) => match (&call.successor, handoff) {
                (Some(successor), Some(grant)) => Ok(ReleaseReply::Queued {
                    grant: grant_for(grant, successor.ttl),
                }),
                _ => Err(unexpected("release", code)),
            },
            Value::Int(code) => Ok(ReleaseReply::Found(ownership(code))),
            Value::Array(ref pair) => match pair.as_slice() {
                [Value::Int(5), Value::Int(fence)] => Ok(ReleaseReply::Transferred {
                    fence: *fence as u64,
                }),
                _ => Err(unexpected("release", code)),
            },
            other => Err(unexpected("release", other)),
        })
        .collect()
}

fn unexpected(what: &str, value: impl std::fmt::Debug) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: format!("unexpected reply to {what}: {value:?}").into(),
    }
}

fn ownership(code: i64) -> Ownership {
    match code {
        // 3: released and handed over to the next waiter (`release.lua`).
        1 | 3 => Ownership::Ours,
        -1 => Ownership::Foreign,
        _ => Ownership::Gone,
    }
}

/// `renew.lua`'s ARGV: owner and TTL of each lease.
impl Node {
    /// `renew.lua`'s arguments: per lease its owner (a shared holder: `~<owner> <label>`, its
    /// member among the key's holders) and TTL.
    fn renew_args(&self, batch: &[Renewal<'_>]) -> Vec<Vec<u8>> {
        let mut args = Vec::with_capacity(batch.len() * 2);
        for item in batch {
            args.push(match item.kind.is_shared() {
                true => [&b"~"[..], &self.member(item.owner)].concat(),
                false => item.owner.as_bytes().to_vec(),
            });
            args.push(millis(item.ttl));
        }
        args
    }
}

/// `acquire.lua`'s code for who asks.
fn asker_code(asker: Asker) -> &'static [u8] {
    match asker {
        Asker::Once => b"0",
        Asker::WillWait => b"1",
        Asker::Waiting => b"2",
    }
}

fn millis(duration: Duration) -> Vec<u8> {
    duration.as_millis().max(1).to_string().into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_demoted_or_unreachable_server_is_asked_about_again() {
        let readonly = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
            "You can't write against a read only replica.",
        ));
        assert!(primary_may_have_moved(&readonly));
        let dropped =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(primary_may_have_moved(&dropped));
        let noperm = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm),
            "no permission",
        ));
        assert!(!primary_may_have_moved(&noperm));
    }
}
