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
//!
//! This module holds the connection and the script call; the typed calls live beside it, one
//! file per job: [`exclusive`] (acquire, release, transfer, the fencing token's write-back),
//! [`efficiency`] (efficiency locks: a first try by `SET NX PX`, a quiet release by deleting),
//! [`shared`] (readers and permits), [`renewal`] (the watchdog's batches) and [`operator`]
//! (inspect, forced unlock, `SCAN`, the doctor's checks).

use super::alive::AliveFlag;
use super::conditional::{ConditionalSet, ContendedKeys};
use super::diagnose;
use super::handover_channel::HandoverChannel;
use super::sentinel::SentinelTarget;
use super::tls;
use crate::engines::engine::{EngineFailure, EngineResult};
use crate::engines::redis::protocol::millis;
use crate::engines::redis::scripts::LuaScript;
use crate::engines::settings::Timeouts;
use crate::engines::settings::TlsFiles;
use crate::error::LockError;
use crate::util::advised::Advised;
use crate::util::tls_advice::chain_mentions;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{FromRedisValue, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod efficiency;
mod exclusive;
mod operator;
mod renewal;
mod shared;

pub(crate) use exclusive::{
    report_refused_publish, reservation_window, settle_release, settle_transfer, LockCall, Place,
    ReleaseCall, ReleaseReply, RESERVATION_WINDOW,
};

/// Replica acknowledgement: the writes that grant or renew a lock are confirmed by this many
/// replicas (`WAIT replicas timeout`) before the lock counts as granted or renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAck {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
    /// How long the marker of a grant taken back stays (the backend's `marker_ttl`).
    pub(crate) marker_ttl: Duration,
}

pub(crate) struct Node {
    target: Target,
    /// The key prefix, for advice in errors (the ACL rules to grant).
    prefix: String,
    timeouts: Timeouts,
    replica_ack: Option<ReplicaAck>,
    /// The grant time, where waiters queue for a held lock (`queue.lua`): how long a waiter's
    /// place in the queue lasts without it asking again, and how long a lock handed over to it
    /// is held before it confirms it. `None`: waiters do not queue.
    grant_time: Option<Duration>,
    /// A waited-on lock's release hands it to the first queued waiter (one server); `false`:
    /// it tells the waiters it is free, and the first of them takes it by asking (Redlock's
    /// masters, which must each grant the same caller).
    hands_over: bool,
    /// How a release announces itself: `PUBLISH`, or `SPUBLISH` (sharded, Redis Cluster).
    publish: &'static str,
    /// The holder label written with every lock (empty: none).
    label: Vec<u8>,
    /// Where handovers to this process's waiters are announced (`None`: on the key's channel).
    handover_channel: Option<Arc<HandoverChannel>>,
    /// Keys whose conditional release, or an efficiency lock's first try, found them waited
    /// on (or held) lately: released, and asked for, by script.
    contended: ContendedKeys,
    /// Exclusive locks carry fencing tokens; `false`: efficiency locks, token 0 (first tries
    /// by `SET NX PX`, releases delete the key: `node/exclusive.rs`).
    fenced: bool,
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
            grant_time: None,
            hands_over: false,
            publish,
            label: Vec::new(),
            handover_channel: None,
            contended: ContendedKeys::default(),
            fenced: true,
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
    /// Cancel safe.
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

    /// Exclusive locks carry fencing tokens unless `fenced` is `false` (efficiency locks).
    pub(crate) fn with_fencing(mut self, fenced: bool) -> Node {
        self.fenced = fenced;
        self
    }

    /// Grants and renewals wait for `ack` replicas (`None`: they do not wait).
    pub(crate) fn with_replica_ack(mut self, ack: Option<ReplicaAck>) -> Node {
        self.replica_ack = ack;
        self
    }

    /// Waiters queue for a held lock (`queue.lua`), each keeping its place for `grant` between
    /// its asks. With `hands_over`, a waited-on lock's release hands it to the first of them,
    /// held for `grant` until the waiter confirms it (with replica acknowledgement, by asking,
    /// whose grant the replicas acknowledge: [`handovers_need_asking`](Self::handovers_need_asking));
    /// without, the release tells the waiters, and the first asks.
    pub(crate) fn with_queue(mut self, grant: Duration, hands_over: bool) -> Node {
        self.grant_time = Some(grant);
        self.hands_over = hands_over;
        self
    }

    /// Handovers to this process's waiters are announced on `channel`, which the node's
    /// subscriber listens to (see [`HandoverChannel`]); only where releases hand locks over.
    pub(crate) fn with_handover_channel(mut self, channel: Arc<HandoverChannel>) -> Node {
        self.handover_channel = Some(channel).filter(|_| self.hands_over);
        self
    }

    /// The channel handovers to this process's waiters are announced on, if it has one.
    pub(crate) fn handover_channel(&self) -> Option<&HandoverChannel> {
        self.handover_channel.as_deref()
    }

    /// Whether a release may grant the lock to a task of this process in the same step (a local
    /// transfer): not with replica acknowledgement, whose grants must each be acknowledged
    /// before they are used, nor on Redlock's masters, which must each decide alike.
    pub(crate) fn grants_in_release(&self) -> bool {
        self.hands_over && self.replica_ack.is_none()
    }

    /// Whether a waiter handed the lock must ask for it before it holds it: with replica
    /// acknowledgement, a grant written inside a release was acknowledged by nobody, and the
    /// ask (answered "already yours") is followed by `WAIT` like any grant.
    pub(crate) fn handovers_need_asking(&self) -> bool {
        self.replica_ack.is_some()
    }

    /// The client of the server this node talks to now (for Sentinel: the primary the sentinels
    /// name, asked for if no connection is open), for connections of other kinds (pub/sub).
    ///
    /// # Cancel safety
    /// Cancel safe.
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
    /// Cancel safe.
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
        // Boxed: opening a connection (a Sentinel lookup, a cluster's slots) is a future of
        // kilobytes, and every call on the node awaits this one, mostly to take the open
        // connection; inline, each call's future would carry it and be copied whole wherever
        // it is boxed.
        let opened = Box::pin(self.open_connection()).await;
        if opened.is_err() && started.elapsed() >= self.timeouts.connect {
            self.slow_failures.fetch_add(1, Ordering::AcqRel);
        }
        opened
    }

    /// Opens a connection to the fixed server, the primary the sentinels name now, or the cluster,
    /// and makes it the node's connection.
    ///
    /// # Cancel safety
    /// Cancel safe.
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
        self.bind(client, generation).await
    }

    /// The `+switch-master` announcements this node's Sentinel target acted on; 0 for a fixed
    /// server or a cluster.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn switches_seen(&self) -> u64 {
        match &self.target {
            Target::Sentinel(target) => target.generation(),
            Target::Fixed(_) | Target::Cluster(_) => 0,
        }
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

    /// A connection manager for `client`, connected, made the node's connection. A connection
    /// that cannot be made is reported as such (nothing was sent), with what its failure says
    /// about TLS: a TLS handshake no one answers, a plain connection reset at once.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped while the connection is made, nothing is kept; the next call makes another.
    async fn bind(&self, client: redis::Client, generation: u64) -> EngineResult<Bound> {
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeouts.response))
            .set_connection_timeout(Some(self.timeouts.connect))
            // Reconnect quickly, but give up soon enough that an unreachable server is an error
            // within a few connect timeouts, not a hang.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250));
        let secure = matches!(
            client.get_connection_info().addr(),
            redis::ConnectionAddr::TcpTls { .. }
        );
        let manager = ConnectionManager::new_with_config(client.clone(), config)
            .await
            .map_err(|err| connect_failure(err, secure, &self.prefix))?;
        Ok(self.keep(Conn::Server(manager), Some(Arc::new(client)), generation))
    }

    /// Connects to the cluster (one reachable node is enough; the others are found from it).
    ///
    /// # Cancel safety
    /// Cancel safe.
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
    /// Not cancel safe: a command already written may still run.
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
    /// Not cancel safe.
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

    /// Sends `cmd` on the node's connection (a server, or a cluster routing it by its keys).
    ///
    /// # Cancel safety
    /// Not cancel safe in general; cancel safe for the read-only commands it is given.
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
/// Not cancel safe.
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
        .arg(millis::arg(ack.timeout));
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

/// A connection that could not be made (`secure`: over TLS): nothing was sent. A TLS handshake
/// with no answer in time is what a plain port gives a TLS client (the server waits for the
/// end of a command line that never comes); a plain connection reset at once is what a TLS
/// port gives a plain client.
fn connect_failure(err: redis::RedisError, secure: bool, prefix: &str) -> EngineFailure {
    let reset = err.is_connection_dropped() || chain_mentions(&err, "connection reset");
    let advice = match (secure, err.is_timeout(), reset) {
        (true, true, _) => Some(
            "the server did not answer the TLS handshake in time: it serves plain connections \
             on this port, it seems; a server without TLS takes the redis:// scheme",
        ),
        (false, _, true) => Some(
            "the server reset the connection before any reply, as a TLS port does with a plain \
             client; if it serves TLS on this port, use a rediss:// URL",
        ),
        _ => None,
    };
    let source: Box<dyn std::error::Error + Send + Sync> = match advice {
        Some(advice) => Box::new(Advised {
            error: err,
            advice: advice.to_owned(),
        }),
        None => diagnose::failure(err, prefix).source,
    };
    EngineFailure {
        ambiguous: false,
        source,
    }
}

fn unexpected(what: &str, value: impl std::fmt::Debug) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: format!("unexpected reply to {what}: {value:?}").into(),
    }
}

/// A time as a script argument's bytes ([`millis::arg`]).
fn ms_arg(time: Duration) -> Vec<u8> {
    millis::arg(time).to_string().into_bytes()
}

/// A number's decimal digits, kept on the stack: a script argument on the lock's hot path
/// that allocates nothing (and skips the formatting machinery `to_string` goes through).
#[derive(Debug, Clone, Copy)]
pub(super) struct Digits {
    buf: [u8; 20],
    start: usize,
}

impl Digits {
    pub(super) fn of(mut n: u64) -> Digits {
        let mut buf = [0u8; 20];
        let mut start = buf.len();
        loop {
            start -= 1;
            buf[start] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                return Digits { buf, start };
            }
        }
    }

    /// [`ms_arg`]'s digits.
    pub(super) fn ms(time: Duration) -> Digits {
        Digits::of(millis::arg(time))
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[self.start..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_are_the_numbers_decimal_form() {
        for n in [
            0,
            1,
            9,
            10,
            99,
            1_000,
            30_000,
            1_733_580_000_123_456,
            u64::MAX,
        ] {
            assert_eq!(Digits::of(n).as_bytes(), n.to_string().as_bytes());
        }
        let time = Duration::from_micros(1_500);
        assert_eq!(Digits::ms(time).as_bytes(), ms_arg(time));
    }

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
