//! What the test targets share about distlock (processes and the network are
//! `distlock-test-support`'s): a backend of each deployment, built the same way so one
//! conformance suite runs against all of them; the multi-process worker (`worker`); a lock key's
//! value as the scripts lay it out (`cell`); what PostgreSQL and MySQL differ in (`database`).
#![allow(dead_code)]

pub mod cell;
pub mod database;
pub mod etcd;
pub mod mysql;
pub mod postgres;
pub mod sections;
pub mod worker;
pub mod zookeeper;

#[allow(unused_imports)]
pub use etcd::{Etcd, EtcdTls};
#[allow(unused_imports)]
pub use mysql::Mysql;
#[allow(unused_imports)]
pub use postgres::Postgres;
#[allow(unused_imports)]
pub use zookeeper::Zookeeper;

use cell::{read_cell, Cell};
use distlock::{Backend, BackendBuilder, Lock, LockError};
use distlock_test_support::{
    wait_until, RedisCluster, RedisServer, Reply, SentinelGroup, ServerConfig, Wake,
};
use std::time::{Duration, Instant};

/// A task that waits up to `wait` for `key` on `backend`, releases it at once, and returns when
/// it got it.
pub fn spawn_waiter(
    backend: &Backend,
    key: &str,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<Instant, LockError>> {
    let backend = backend.clone();
    let key = key.to_owned();
    tokio::spawn(async move {
        let guard = Lock::new(key).on(&backend).wait(wait).acquire().await?;
        let acquired = Instant::now();
        guard.release().await?;
        Ok(acquired)
    })
}

/// Waits until `key` is marked as waited on on `fx`'s servers (a writer registered its intent,
/// or a waiter was turned away): looked at (inspect is the only window into every kind's state)
/// each time a server reports a command, such as the script that marks it.
pub async fn until_waited_on<F: Fixture>(fx: &F, key: &str) {
    let mut holder = None;
    let waited_on = until(fx, Duration::from_secs(5), async || {
        holder = fx.backend().inspect(key).await.unwrap();
        holder.as_ref().is_some_and(|holder| holder.waited_on)
    })
    .await;
    assert!(waited_on, "{key} never waited on: {holder:?}");
}

/// Waits (at most 5 s) until `key`, whose lease `backend` has lost by its own reckoning, has
/// expired on `server` too, woken by the server's expiry event.
pub async fn assert_expires_on_server(server: &RedisServer, backend: &Backend, key: &str) {
    let expired = wait_until(
        &[server],
        Wake::CommandsAndExpiries,
        Duration::from_secs(5),
        async || backend.inspect(key).await.unwrap().is_none(),
    )
    .await;
    assert!(
        expired,
        "the fixed lease's key outlived its lease on the server"
    );
}

/// The backend failure inside `err`, which must be one and not ambiguous: the command surely
/// did not run (a refused handshake, a refused permission).
pub fn certain_backend_failure(err: &LockError) -> &distlock::BackendError {
    let LockError::Backend(failure) = err else {
        panic!("expected a backend error, got {err:?}")
    };
    assert!(
        !failure.is_ambiguous(),
        "the command cannot have run: {err}"
    );
    failure
}

/// A backend under test, with whatever process it needs.
pub trait Fixture: Sized + Send + Sync + 'static {
    /// Starts the backend, letting the test adjust its settings.
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self;
    fn backend(&self) -> &Backend;
    /// Makes the backend forget the token marker of `key` (its last token), as a restart without
    /// persistence or an eviction would.
    fn forget_token_marker(&self, key: &str) -> impl std::future::Future<Output = ()> + Send;
    /// Remaining TTL of `key` on the server, `None` when the key is gone.
    fn pttl(&self, key: &str) -> impl std::future::Future<Output = Option<Duration>> + Send;
    /// A second client of the same server, with its own local queues and stats: what another
    /// process would be. A contender on it is refused by the server, not by a local queue.
    fn contender(&self) -> Backend;
    /// The lock keys held on the server now, among `candidates` (Redis: every lock key under
    /// the prefix, candidates or not).
    fn held_keys(
        &self,
        candidates: &[String],
    ) -> impl std::future::Future<Output = Vec<String>> + Send;
    /// `"in-process"` or `"redis"`, for the figures tests print.
    fn kind(&self) -> &'static str;
    /// The servers the locks live on (Sentinel: the primary; Cluster: the masters), whose
    /// events wake [`until`]; none for the in-process backend.
    fn servers(&self) -> Vec<&RedisServer>;
    /// Whether exclusive locks carry fencing tokens (`false`: efficiency locks, token 0).
    fn fenced(&self) -> bool {
        true
    }
    /// The smallest fencing token the deployment hands out: Redis's tokens start from its
    /// microsecond clock (past 10^15), so that a counter lost with its server never issues a
    /// token below one issued before; etcd's are its revision, which is never lost.
    fn least_token(&self) -> u64 {
        1_000_000_000_000_000
    }
    /// How long the servers hold a lease of `ttl` that nobody renews: `ttl` itself, but on
    /// etcd, which counts leases in whole seconds, checks them twice a second, and hands a new
    /// lease to the grants of the next second.
    fn held_for(&self, ttl: Duration) -> Duration {
        ttl
    }
    /// How many grants in a row the fencing-token test takes: 10,000, but 2,000 on etcd,
    /// whose every grant and release is a write its members commit in turn (its token is
    /// the store's revision, with no counter to lose on the way).
    fn grants_in_a_row(&self) -> usize {
        10_000
    }
    /// The etcd cluster the locks live on, for the etcd backend.
    fn etcd(&self) -> Option<&distlock_test_support::EtcdCluster> {
        None
    }
    /// The PostgreSQL server the locks live on, for the PostgreSQL backend.
    fn postgres(&self) -> Option<&distlock_test_support::PgServer> {
        None
    }
    /// The MariaDB server the locks live on, for the MySQL backend.
    fn mysql(&self) -> Option<&distlock_test_support::MariaDbServer> {
        None
    }
    /// The ZooKeeper ensemble the locks live on, for the ZooKeeper backend.
    fn zookeeper(&self) -> Option<&distlock_test_support::ZkEnsemble> {
        None
    }
}

/// Waits up to `within` until `check` holds: re-checked each time one of `fx`'s servers reports
/// a command or an expiry ([`wait_until`]), so `check` must read them with read-only commands
/// only. The in-process backend is in this process: there `check` is re-run at every change of
/// local state the runtime's test hooks report (`raw::until_local`).
pub async fn until<F: Fixture>(fx: &F, within: Duration, check: impl AsyncFnMut() -> bool) -> bool {
    if let Some(cluster) = fx.etcd() {
        return etcd::until_on_etcd(cluster, within, check).await;
    }
    if let Some(server) = fx.postgres() {
        return postgres::until_on_postgres(server, within, check).await;
    }
    if let Some(server) = fx.mysql() {
        return mysql::until_on_mysql(server, within, check).await;
    }
    if let Some(ensemble) = fx.zookeeper() {
        return zookeeper::until_on_zookeeper(ensemble, within, check).await;
    }
    let servers = fx.servers();
    if !servers.is_empty() {
        return wait_until(&servers, Wake::CommandsAndExpiries, within, check).await;
    }
    // In-process: every change of the backend's local state (a waiter's watch included) wakes
    // the check.
    distlock::__private::raw::until_local(within, check).await
}

pub struct InProcess {
    backend: Backend,
}

/// The in-process backend forgets a token marker by letting it expire: its markers live 1 ms.
const IN_PROCESS_FENCE_TTL: Duration = Duration::from_millis(1);

impl Fixture for InProcess {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let builder = configure(Backend::builder("memory://").marker_ttl(IN_PROCESS_FENCE_TTL));
        InProcess {
            backend: builder.build().expect("valid in-process settings"),
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    async fn forget_token_marker(&self, _key: &str) {
        // No event marks a TTL running out; waiting it out is the point of this step.
        tokio::time::sleep(IN_PROCESS_FENCE_TTL * 2).await;
    }

    async fn pttl(&self, key: &str) -> Option<Duration> {
        self.backend
            .inspect(key)
            .await
            .expect("in-process inspect")
            .map(|holder| holder.ttl)
    }

    fn contender(&self) -> Backend {
        distlock::__private::raw::another_client(&self.backend)
    }

    async fn held_keys(&self, candidates: &[String]) -> Vec<String> {
        let mut held = Vec::new();
        for key in candidates {
            if self.backend.inspect(key).await.unwrap().is_some() {
                held.push(key.clone());
            }
        }
        held
    }

    fn kind(&self) -> &'static str {
        "in-process"
    }

    fn servers(&self) -> Vec<&RedisServer> {
        Vec::new()
    }
}

/// One server and a backend on it; the server's kind (Redis, Valkey) is the type parameter.
pub struct OneServer<K> {
    pub server: RedisServer,
    backend: Backend,
    /// The settings the backend was built with, for more clients like it.
    builder: BackendBuilder,
    kind: std::marker::PhantomData<fn() -> K>,
}

/// Which server a [`OneServer`] runs.
pub trait ServerKind: 'static {
    const NAME: &'static str;
    /// Exclusive locks carry fencing tokens (`false`: efficiency locks,
    /// `BackendBuilder::fencing_tokens(false)`).
    const FENCED: bool = true;
    fn config() -> ServerConfig;
}

pub struct RedisKind;

impl ServerKind for RedisKind {
    const NAME: &'static str = "redis";
    fn config() -> ServerConfig {
        ServerConfig::new()
    }
}

/// Valkey (8.1 here), the backend on it as on Redis.
pub struct ValkeyKind;

impl ServerKind for ValkeyKind {
    const NAME: &'static str = "valkey";
    fn config() -> ServerConfig {
        ServerConfig::new().valkey()
    }
}

/// One Redis server whose backend takes efficiency locks: no fencing tokens.
pub struct UnfencedKind;

impl ServerKind for UnfencedKind {
    const NAME: &'static str = "redis (efficiency locks)";
    const FENCED: bool = false;
    fn config() -> ServerConfig {
        ServerConfig::new()
    }
}

/// One Redis server.
pub type SingleRedis = OneServer<RedisKind>;
/// One Redis server, its locks efficiency locks.
pub type UnfencedRedis = OneServer<UnfencedKind>;
/// One Valkey server.
pub type Valkey = OneServer<ValkeyKind>;

pub const PREFIX: &str = "t";

impl<K> OneServer<K> {
    pub fn lock_key(key: &str) -> String {
        format!("{PREFIX}:{{{key}}}")
    }

    /// A second backend on the same server, with the same settings: a client with its own
    /// connections and local queues, as another process would have.
    pub fn another_backend(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }
}

impl<K: ServerKind> Fixture for OneServer<K> {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let server = RedisServer::start_with(K::config());
        let builder = Backend::builder(server.url())
            .prefix(PREFIX)
            .fencing_tokens(K::FENCED);
        let builder = configure(builder);
        OneServer {
            backend: builder.clone().build().expect("valid settings"),
            builder,
            server,
            kind: std::marker::PhantomData,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    async fn forget_token_marker(&self, key: &str) {
        assert!(
            forget_marker(&self.server, &Self::lock_key(key)),
            "the released lock left its token marker"
        );
    }

    async fn pttl(&self, key: &str) -> Option<Duration> {
        held_pttl(&self.server, &Self::lock_key(key))
    }

    fn contender(&self) -> Backend {
        self.another_backend()
    }

    async fn held_keys(&self, _candidates: &[String]) -> Vec<String> {
        self.lock_keys_on_server()
    }

    fn kind(&self) -> &'static str {
        K::NAME
    }

    fn fenced(&self) -> bool {
        K::FENCED
    }

    fn servers(&self) -> Vec<&RedisServer> {
        vec![&self.server]
    }
}

impl<K> OneServer<K> {
    /// Every lock held under the prefix on the server (the markers of free locks excluded).
    pub fn lock_keys_on_server(&self) -> Vec<String> {
        held_lock_keys(&self.server)
    }

    /// Calls of `command` the server has executed (`INFO commandstats`), e.g. `evalsha`.
    pub fn command_calls(&self, command: &str) -> u64 {
        command_calls(&self.server, command)
    }
}

/// Calls of `command` `server` has executed (`INFO commandstats`; commands run by scripts
/// included), e.g. `evalsha`.
pub fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.command(&["INFO", "commandstats"]).as_str().unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Redlock over three real masters.
pub struct Redlock {
    pub servers: Vec<RedisServer>,
    backend: Backend,
    builder: BackendBuilder,
}

impl Redlock {
    /// The masters' URLs.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The remaining TTL of `key` on each master (`None` where it is absent).
    pub fn pttls(&self, key: &str) -> Vec<Option<Duration>> {
        self.servers
            .iter()
            .map(|server| held_pttl(server, &SingleRedis::lock_key(key)))
            .collect()
    }
}

impl Fixture for Redlock {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let servers = RedisServer::start_many(3);
        let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
        let builder = configure(Backend::redlock(urls).prefix(PREFIX));
        Redlock {
            backend: builder.clone().build().expect("valid redlock settings"),
            builder,
            servers,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    async fn forget_token_marker(&self, key: &str) {
        let lock = SingleRedis::lock_key(key);
        let forgotten = self
            .servers
            .iter()
            .filter(|server| forget_marker(server, &lock))
            .count();
        assert!(forgotten >= 2, "a quorum of masters had the marker");
    }

    /// The lock lives as long as a quorum (2 of 3) of its copies.
    async fn pttl(&self, key: &str) -> Option<Duration> {
        let mut held: Vec<Duration> = self.pttls(key).into_iter().flatten().collect();
        held.sort_by_key(|ttl| std::cmp::Reverse(*ttl));
        held.get(1).copied()
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    async fn held_keys(&self, _candidates: &[String]) -> Vec<String> {
        let mut held = std::collections::BTreeSet::new();
        for server in &self.servers {
            held.extend(held_lock_keys(server));
        }
        held.into_iter().collect()
    }

    fn kind(&self) -> &'static str {
        "redlock"
    }

    fn servers(&self) -> Vec<&RedisServer> {
        self.servers.iter().collect()
    }
}

/// A primary with one replica and three sentinels; the backend finds the primary through the
/// sentinels and has every grant and renewal acknowledged by the replica (`min_replicas(1)`).
pub struct SentinelOf<const TLS: bool> {
    pub group: SentinelGroup,
    backend: Backend,
    builder: BackendBuilder,
}

/// A Sentinel group over plain connections.
pub type Sentinel = SentinelOf<false>;
/// A Sentinel group that speaks TLS only, to clients, between servers and between sentinels
/// (`rediss-sentinel://`).
pub type SentinelTls = SentinelOf<true>;

impl<const TLS: bool> SentinelOf<TLS> {
    fn primary(&self) -> &RedisServer {
        self.group.primary()
    }
}

impl<const TLS: bool> Fixture for SentinelOf<TLS> {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        let down_after = Duration::from_secs(5);
        let group = match TLS {
            true => SentinelGroup::start_tls(1, down_after),
            false => SentinelGroup::start(down_after),
        };
        let mut base = Backend::builder(group.sentinel_url());
        if let Some(pki) = group.pki() {
            base = base.tls_ca_file(pki.ca());
        }
        let builder = configure(base.prefix(PREFIX).min_replicas(1));
        SentinelOf {
            backend: builder.clone().build().expect("valid sentinel settings"),
            builder,
            group,
        }
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    async fn forget_token_marker(&self, key: &str) {
        assert!(
            forget_marker(self.primary(), &SingleRedis::lock_key(key)),
            "the released lock left its token marker"
        );
    }

    async fn pttl(&self, key: &str) -> Option<Duration> {
        held_pttl(self.primary(), &SingleRedis::lock_key(key))
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    async fn held_keys(&self, _candidates: &[String]) -> Vec<String> {
        held_lock_keys(self.primary())
    }

    fn kind(&self) -> &'static str {
        match TLS {
            true => "sentinel over TLS",
            false => "sentinel",
        }
    }

    fn servers(&self) -> Vec<&RedisServer> {
        vec![self.primary()]
    }
}

/// A Redis Cluster of three masters with one replica each; the backend talks to it through
/// redis-rs's cluster client. `TLS`: every node speaks TLS only to clients, on the cluster bus
/// and for replication (`rediss-cluster://`).
pub struct ClusterOf<const TLS: bool> {
    pub cluster: RedisCluster,
    backend: Backend,
    builder: BackendBuilder,
}

/// A Redis Cluster over plain connections.
pub type Cluster = ClusterOf<false>;
/// A Redis Cluster over TLS only.
pub type ClusterTls = ClusterOf<true>;

impl<const TLS: bool> ClusterOf<TLS> {
    /// The node that owns `key`'s lock now.
    pub fn owner_of(&self, key: &str) -> &RedisServer {
        self.cluster
            .node_for_slot(RedisCluster::slot_of(SingleRedis::lock_key(key)))
    }

    /// A cluster whose nodes are also given `args` (configuration directives and values).
    pub fn start_with_nodes(
        args: &[(&str, &str)],
        configure: impl FnOnce(BackendBuilder) -> BackendBuilder,
    ) -> Self {
        let node_timeout = Duration::from_secs(2);
        let cluster = match TLS {
            true => RedisCluster::start_tls(3, 1, node_timeout, args),
            false => RedisCluster::start_with(3, 1, node_timeout, args),
        };
        ClusterOf::from(cluster, configure)
    }

    fn from(
        cluster: RedisCluster,
        configure: impl FnOnce(BackendBuilder) -> BackendBuilder,
    ) -> Self {
        let mut base = Backend::builder(cluster.url());
        if let Some(pki) = cluster.pki() {
            base = base.tls_ca_file(pki.ca());
        }
        let builder = configure(base.prefix(PREFIX));
        ClusterOf {
            backend: builder.clone().build().expect("valid cluster settings"),
            builder,
            cluster,
        }
    }
}

impl<const TLS: bool> Fixture for ClusterOf<TLS> {
    fn start(configure: impl FnOnce(BackendBuilder) -> BackendBuilder) -> Self {
        ClusterOf::start_with_nodes(&[], configure)
    }

    fn backend(&self) -> &Backend {
        &self.backend
    }

    async fn forget_token_marker(&self, key: &str) {
        assert!(
            forget_marker(self.owner_of(key), &SingleRedis::lock_key(key)),
            "the released lock left its token marker"
        );
    }

    async fn pttl(&self, key: &str) -> Option<Duration> {
        held_pttl(self.owner_of(key), &SingleRedis::lock_key(key))
    }

    fn contender(&self) -> Backend {
        self.builder.clone().build().unwrap()
    }

    async fn held_keys(&self, _candidates: &[String]) -> Vec<String> {
        let mut held = std::collections::BTreeSet::new();
        for master in self.cluster.masters() {
            held.extend(held_lock_keys(master));
        }
        held.into_iter().collect()
    }

    fn kind(&self) -> &'static str {
        match TLS {
            true => "cluster over TLS",
            false => "cluster",
        }
    }

    fn servers(&self) -> Vec<&RedisServer> {
        self.cluster.masters()
    }
}

/// Every lock held under the prefix on `server` (the markers free locks leave excluded), as one
/// snapshot: the keys and their values are read by one script, at one instant of the server's,
/// in one round trip — however many keys a test left, the check sees them all as they were when
/// it began, and a lock released a moment later cannot hide among keys read one by one.
pub fn held_lock_keys(server: &RedisServer) -> Vec<String> {
    // A cluster node runs it over the keys of all its slots (cross-slot, by the flag).
    const SNAPSHOT: &str = "#!lua flags=allow-cross-slot-keys\n\
        local keys = redis.call('KEYS', ARGV[1]) local found = {} \
        for _, key in ipairs(keys) do \
          found[#found + 1] = key found[#found + 1] = redis.call('GET', key) \
        end return found";
    let reply = server.command(&["EVAL", SNAPSHOT, "0", &format!("{PREFIX}:*")]);
    let Reply::Array(Some(pairs)) = reply else {
        panic!("the snapshot of the lock keys failed: {reply:?}")
    };
    pairs
        .chunks_exact(2)
        .filter(|pair| !pair[1].is_nil())
        .filter(|pair| {
            let value = pair[1].as_str().expect("a lock key holds a string");
            cell::parse(&value).is_held()
        })
        .map(|pair| pair[0].as_str().expect("a key name").to_owned())
        .collect()
}

/// The remaining TTL of the lock `lock` on `server`; `None` when it is not held.
pub fn held_pttl(server: &RedisServer, lock: &str) -> Option<Duration> {
    if !read_cell(server, lock).is_held() {
        return None;
    }
    match server.command(&["PTTL", lock]) {
        Reply::Int(ms) if ms >= 0 => Some(Duration::from_millis(ms as u64)),
        Reply::Int(-2) => None,
        other => panic!("unexpected PTTL reply {other:?}"),
    }
}

/// Deletes the token marker a release left under `lock` on `server` (the counter lost: a
/// restart, an eviction); `false` when there was none.
pub fn forget_marker(server: &RedisServer, lock: &str) -> bool {
    matches!(read_cell(server, lock), Cell::Free { .. })
        && server.command(&["DEL", lock]) == Reply::Int(1)
}

/// Keyspace notifications of the writes to `lock` on `server` (string commands: the acquire's
/// `SET`, the busy path's `SETRANGE`, the release's `SET` of the marker), subscribed before the
/// call that must release it.
pub async fn watch_lock_writes(server: &RedisServer, lock: &str) -> redis::aio::PubSub {
    watch_key_events(server, lock, "K$").await
}

/// Keyspace notifications of `key` on `server` of the event `classes` (`notify-keyspace-events`
/// syntax: `K$` string writes, `Kg` generic ones such as `expire`).
pub async fn watch_key_events(
    server: &RedisServer,
    key: &str,
    classes: &str,
) -> redis::aio::PubSub {
    server.command(&["CONFIG", "SET", "notify-keyspace-events", classes]);
    let client = redis::Client::open(server.url()).unwrap();
    let mut writes = client.get_async_pubsub().await.unwrap();
    writes
        .subscribe(format!("__keyspace@0__:{key}"))
        .await
        .unwrap();
    writes
}

/// Waits, woken by `writes`, until `lock` was *released* on `server` — it holds a release's
/// marker; an expiry (which leaves no key and writes nothing) never satisfies it. `false` when
/// `limit` passed first.
pub async fn released_within(
    server: &RedisServer,
    writes: &mut redis::aio::PubSub,
    lock: &str,
    limit: Duration,
) -> bool {
    use futures_util::StreamExt;
    let released = async {
        let mut writes = writes.on_message();
        while !matches!(read_cell(server, lock), Cell::Free { .. }) {
            writes.next().await.expect("the notification stream ended");
        }
    };
    tokio::time::timeout(limit, released).await.is_ok()
}

/// A backend (with the tests' prefix) that talks to `server` through a fault proxy, its
/// connection opened and scripts loaded before any fault is armed, so that a fault hits the
/// command under test rather than the connection handshake or a NOSCRIPT round trip.
pub async fn through_proxy(
    server: &RedisServer,
    configure: impl FnOnce(BackendBuilder) -> BackendBuilder,
) -> (distlock_test_support::FaultProxy, Backend) {
    let proxy = distlock_test_support::FaultProxy::start(server.addr()).await;
    let backend = configure(Backend::builder(proxy.url()).prefix(PREFIX))
        .build()
        .unwrap();
    Lock::new("warm-up")
        .on(&backend)
        .run(async {})
        .await
        .unwrap();
    (proxy, backend)
}

/// The release channel of `key` (tests' prefix).
pub fn channel(key: &str) -> String {
    format!("{}:released", SingleRedis::lock_key(key))
}

/// Subscribers of `key`'s release channel on `server` (`PUBSUB NUMSUB`).
pub fn subscribers(server: &RedisServer, key: &str) -> i64 {
    server.subscribers(&channel(key))
}

/// Waits (at most 5 s) until `key`'s channel has `n` subscribers on `server`, re-counting each
/// time the server reports a command (a SUBSCRIBE, an UNSUBSCRIBE, …).
pub async fn until_subscribers(server: &RedisServer, key: &str, n: i64) {
    until_channel_subscribers(server, "NUMSUB", RedisServer::subscribers, key, n).await
}

/// [`until_subscribers`] for sharded subscribers (`PUBSUB SHARDNUMSUB`, Redis Cluster).
pub async fn until_shard_subscribers(server: &RedisServer, key: &str, n: i64) {
    until_channel_subscribers(
        server,
        "SHARDNUMSUB",
        RedisServer::shard_subscribers,
        key,
        n,
    )
    .await
}

/// `counter` counts a channel's subscribers on a server with `PUBSUB <count>`.
async fn until_channel_subscribers(
    server: &RedisServer,
    count: &str,
    counter: fn(&RedisServer, &str) -> i64,
    key: &str,
    n: i64,
) {
    let channel = channel(key);
    let mut now = 0;
    let reached = server
        .wait_until(Duration::from_secs(5), async || {
            now = counter(server, &channel);
            now == n
        })
        .await;
    assert!(
        reached,
        "{key} has {now} subscribers (PUBSUB {count}), never {n}"
    );
}

/// The entries of the processes queued for `lock` (a lock key, prefixed) on `server`, first
/// come first (`queue.lua`: `<grant ms> <owner>[ ><channel>][ <label>]`); waiters whose entry
/// lapsed are left out, as a release skips them.
pub fn queued(server: &RedisServer, lock: &str) -> Vec<String> {
    let queue = format!("{lock}:queue");
    let owners = server.command(&["ZRANGE", &queue, "0", "-1"]);
    owners
        .as_array()
        .unwrap_or_default()
        .iter()
        .filter_map(|owner| {
            let entry = format!("{queue}:{}", owner.as_str()?);
            server.command(&["GET", &entry]).as_str()
        })
        .collect()
}

/// The entry of the first process queued for `key` (tests' prefix) on `server` whose entry
/// lives: the waiter a release hands the lock to.
pub fn first_queued(server: &RedisServer, key: &str) -> Option<String> {
    queued(server, &SingleRedis::lock_key(key))
        .into_iter()
        .next()
}
