//! [`BackendBuilder`]: every setting of a backend, each with its default.

use super::handle::Backend;
use crate::engines::settings::{read_pem, Timeouts, TlsFiles};
use crate::engines::spec::EngineSpec;
use crate::error::LockError;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The fraction of a lease taken off its validity for clock drift, unless set.
pub(crate) const DEFAULT_DRIFT_FACTOR: f64 = 0.01;

/// [`BackendBuilder::local_batch`]'s default: a local transfer costs one round trip and a script,
/// 50–150 µs on loopback, so a process hands a busy key on several times before yielding it.
const DEFAULT_LOCAL_BATCH: Duration = Duration::from_millis(1);

impl Backend {
    /// A builder for a backend at `url` (the `rediss`, `rediss-sentinel`, `rediss-cluster` and
    /// `etcds` schemes are the same over TLS, feature `tls`): `redis://host:port/db`, `rediss://…`,
    /// `redis+unix:///path` / `unix:///path`, `memory://` for the in-process backend,
    /// `redis-cluster://[user:password@]host:port[,host:port…]` for a Redis Cluster (seed
    /// nodes), `etcd://[user:password@]host:2379[,host:2379…]` for an etcd cluster (feature
    /// `etcd`; see `Backend::etcd`), or `redis-sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[?db=N]` for the
    /// primary a Sentinel group names, followed across failovers (the user info is the primary's;
    /// sentinels that require a password of their own take `sentinel_username=…` /
    /// `sentinel_password=…` in the query).
    ///
    /// ```
    /// let backend = distlock::Backend::builder(
    ///     "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379/orders",
    /// )
    /// .min_replicas(1)
    /// .build()
    /// .expect("a valid Sentinel URL");
    /// # let _ = backend;
    /// ```
    pub fn builder(url: impl Into<String>) -> BackendBuilder {
        BackendBuilder::new(crate::engines::from_url(&url.into()))
    }
}

/// Configures a [`Backend`]. Every setter states its default; [`build`](Self::build) checks them
/// all and names the first one that is wrong.
///
/// ```
/// use distlock::Backend;
/// use std::time::Duration;
///
/// let err = Backend::builder("redis://127.0.0.1:6379")
///     .watchdog_lease(Duration::from_millis(10))
///     .build()
///     .unwrap_err();
/// assert!(err.to_string().contains("at least 100ms"), "{err}");
/// ```
#[derive(Clone)]
pub struct BackendBuilder {
    /// The deployment, or what is wrong with it (reported by `build`).
    pub(super) spec: Result<Arc<dyn EngineSpec>, (String, String)>,
    pub(super) prefix: String,
    pub(super) watchdog_lease: Duration,
    pub(super) max_key_len: usize,
    pub(super) marker_ttl: Duration,
    pub(super) renew_batch: usize,
    pub(super) local_batch: Duration,
    pub(super) max_backoff: Duration,
    pub(super) drift_factor: f64,
    pub(super) timeouts: Timeouts,
    /// Redlock only: how long one master may take; `None` until set (default 50 ms).
    pub(super) master_timeout: Option<Duration>,
    /// Replicas that must acknowledge a grant or renewal; 0: none.
    pub(super) min_replicas: u32,
    /// How long to wait for them; `None` until set (default 200 ms, or a quarter of the lease TTL
    /// when that is less).
    pub(super) replica_timeout: Option<Duration>,
    /// `None` until set: `hostname:pid`.
    pub(super) holder_label: Option<String>,
    /// A database's schema for the lock tables; `None` until set (`distlock`).
    pub(super) schema: Option<String>,
    /// Whether a database engine creates its schema when it is missing.
    pub(super) create_schema: bool,
    /// Exclusive locks carry fencing tokens; `false`: efficiency locks.
    pub(super) fencing_tokens: bool,
    pub(super) tls: TlsFiles,
    /// A TLS file that could not be read: reported by `build`, which names every problem.
    pub(super) tls_error: Option<(&'static str, String)>,
}

/// The URL is shown without its password; certificates only as set or not.
impl std::fmt::Debug for BackendBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendBuilder")
            .field(
                "deployment",
                &self.spec.as_ref().map(|spec| spec.deployment()),
            )
            .field("at", &self.spec.as_ref().map(|spec| spec.describe()))
            .field("prefix", &self.prefix)
            .field("watchdog_lease", &self.watchdog_lease)
            .field("max_key_len", &self.max_key_len)
            .field("marker_ttl", &self.marker_ttl)
            .field("renew_batch", &self.renew_batch)
            .field("local_batch", &self.local_batch)
            .field("max_backoff", &self.max_backoff)
            .field("clock_drift_factor", &self.drift_factor)
            .field("timeouts", &self.timeouts)
            .field("master_timeout", &self.master_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("replica_timeout", &self.replica_timeout)
            .field("holder_label", &self.holder_label)
            .field("schema", &self.schema)
            .field("create_schema", &self.create_schema)
            .field("fencing_tokens", &self.fencing_tokens)
            .field("tls", &self.tls)
            .finish()
    }
}

impl BackendBuilder {
    /// A builder for the deployment `spec`, or one that reports what is wrong with it at
    /// [`build`](Self::build): what `Backend::builder` and each deployment's typed constructor
    /// make.
    pub(crate) fn new(spec: Result<Arc<dyn EngineSpec>, LockError>) -> Self {
        BackendBuilder {
            spec: spec.map_err(|err| match err {
                LockError::InvalidConfig { setting, problem } => (setting, problem),
                other => ("url".into(), other.to_string()),
            }),
            prefix: "distlock".into(),
            watchdog_lease: Duration::from_secs(30),
            max_key_len: 512,
            marker_ttl: Duration::from_secs(3600),
            renew_batch: 256,
            local_batch: DEFAULT_LOCAL_BATCH,
            max_backoff: Duration::from_millis(100),
            drift_factor: DEFAULT_DRIFT_FACTOR,
            timeouts: Timeouts::default(),
            master_timeout: None,
            min_replicas: 0,
            replica_timeout: None,
            holder_label: None,
            schema: None,
            create_schema: false,
            fencing_tokens: true,
            tls: TlsFiles::default(),
            tls_error: None,
        }
    }

    /// Namespace of every key this backend writes: `<prefix>:{<key>}`. Default `"distlock"`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// TTL of watchdog leases, renewed every third of it while the call runs. Default 30 s;
    /// at least 100 ms.
    pub fn watchdog_lease(mut self, ttl: Duration) -> Self {
        self.watchdog_lease = ttl;
        self
    }

    /// Longest accepted key in bytes, after rendering and escaping; a longer key is
    /// [`LockError::InvalidKey`], never truncated. Default 512.
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.max_key_len = bytes;
        self
    }

    /// How long a released lock's token marker (the last fencing token, which the next one must
    /// exceed) stays on the server. Tokens keep increasing after the marker expires (they are at
    /// least the server time in µs); the marker only guards against the server clock stepping back
    /// by less than this. Default 1 h.
    pub fn marker_ttl(mut self, ttl: Duration) -> Self {
        self.marker_ttl = ttl;
        self
    }

    /// Most leases renewed by one script call. Default 256.
    pub fn renew_batch(mut self, leases: usize) -> Self {
        self.renew_batch = leases;
        self
    }

    /// How long the tasks of this process may go on holding a key one after another — the lock
    /// passing from each to the next by a local transfer, one script — while tasks of other
    /// processes are queued for it. Past that, the holder's release hands the lock to the first
    /// process in the queue, and this process's next task goes to the back. Default 1 ms.
    ///
    /// A local transfer costs one round trip, a handoff to another process about two (the
    /// release, then its message to the waiting process). Batching local transfers therefore
    /// fits more critical sections in a second when they are short, and costs the other
    /// process a wait of at most this long plus one critical section; when they are long, a
    /// batch holds one or two and the key alternates between processes. `Duration::ZERO`
    /// alternates strictly. Within a process tasks are served in the order they asked, whatever
    /// this says. Only locks of one server (standalone, Sentinel) and of a Cluster are batched
    /// this way; Redlock and replica acknowledgement transfer nothing locally.
    pub fn local_batch(mut self, time: Duration) -> Self {
        self.local_batch = time;
        self
    }

    /// The longest a waiter sleeps between tries when no release notification arrives: the worst
    /// delay a lost notification can add. Default 100 ms. It also sets the grant time, three
    /// times it (at least 300 ms): how long a process queued for a busy lock keeps its place
    /// without asking, and so how long a waiter that died holds up the queue.
    pub fn max_backoff(mut self, delay: Duration) -> Self {
        self.max_backoff = delay;
        self
    }

    /// The fraction of a lease taken off its validity for clock drift between this process and
    /// the server(s) (plus 2 ms): a lease granted for TTL `t` is trusted for `t·(1 − f) − 2 ms`
    /// from when it was requested. Default 0.01 (Redlock's); at most 0.5.
    pub fn clock_drift_factor(mut self, factor: f64) -> Self {
        self.drift_factor = factor;
        self
    }

    /// How long to wait for a reply before the outcome counts as unknown (and an acquire is
    /// retried with the same owner token). Default 500 ms (redis-rs's own default).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.response = timeout;
        self
    }

    /// Redlock only: how long one master may take to answer before its vote (or renewal, or
    /// release) counts as refused. Far below the lease TTL: an acquire or a renewal round costs
    /// at most this, whatever the slow masters do. Default 50 ms; less than a third of
    /// `watchdog_lease`. Setting it on a backend that is not Redlock is an error.
    pub fn master_timeout(mut self, timeout: Duration) -> Self {
        self.master_timeout = Some(timeout);
        self
    }

    /// Replica acknowledgement: every acquire is followed, in the same round trip, by `WAIT n
    /// replica_timeout`, and a lock fewer than `n` replicas confirmed is released again and the
    /// call fails with [`LockError::ReplicasNotAcknowledged`]; renewals are acknowledged the same
    /// way, and a lease's validity advances only on acknowledged renewals. Default 0 (off).
    ///
    /// It narrows the window in which a failover loses a lock (the primary acknowledges, dies
    /// before replicating, and the promoted replica never saw the key); it does not close it
    /// (a replica that acknowledged may not be the one promoted, and `WAIT` does not make
    /// replication synchronous). A lock that must never be held twice also needs fencing tokens
    /// at the resource, or Redlock. Costs: a round trip to the replicas per grant and renewal,
    /// and grants fail while fewer than `n` replicas are connected. For a `redis://` primary
    /// with replicas, or `redis-sentinel://`; an error for Redlock (independent masters) and the
    /// in-process backend.
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let backend = distlock::Backend::builder("redis://10.0.0.1:6379")
    ///     .min_replicas(1)
    ///     .replica_timeout(Duration::from_millis(200))
    ///     .build()
    ///     .expect("valid settings");
    /// # let _ = backend;
    /// ```
    pub fn min_replicas(mut self, replicas: u32) -> Self {
        self.min_replicas = replicas;
        self
    }

    /// How long a grant or renewal waits for [`min_replicas`](Self::min_replicas)
    /// acknowledgements. Default 200 ms (a quarter of `watchdog_lease` when that is less); at
    /// least 1 ms and less than a third of `watchdog_lease`. The reply of a grant or renewal,
    /// which carries its `WAIT`, may take this on top of `response_timeout` before it counts as
    /// lost. Setting it while `min_replicas` is 0 is an error.
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = Some(timeout);
        self
    }

    /// Who this process is, in words an operator recognises: written with every lock it takes,
    /// shown by [`Backend::inspect`] and `distlock inspect`/`list`, so "who holds it" has an
    /// answer. Default `hostname:pid`; `""` writes none. At most 128 bytes of one line of text
    /// (no control characters). Never put secrets in it: anyone who can read the lock keys sees
    /// it.
    ///
    /// ```
    /// let backend = distlock::Backend::in_process_builder()
    ///     .holder_label("billing-worker-3")
    ///     .build()
    ///     .expect("a valid label");
    /// # let _ = backend;
    /// ```
    pub fn holder_label(mut self, label: impl Into<String>) -> Self {
        self.holder_label = Some(label.into());
        self
    }

    /// A database's schema that holds the lock tables (PostgreSQL, feature `postgres`; on MySQL,
    /// feature `mysql`, the database that holds them): a lowercase SQL identifier (letters,
    /// digits and `_`, at most 63 bytes, 40 on MySQL). Default `distlock`. Setting it for a
    /// deployment that is not a database is an error.
    pub fn schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = Some(schema.into());
        self
    }

    /// Whether a database engine creates its schema (what `distlock schema postgres` or
    /// `distlock schema mysql` prints: the schema or database, the tables, and the functions or
    /// procedures) at its first use when it is missing. Default `false`: a missing schema is an error that names what to run, so that
    /// the application's own migrations stay in charge; the user needs `CREATE` on the
    /// database when this is on. Setting it for a deployment that is not a database is an
    /// error.
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// Whether exclusive locks carry fencing tokens. Default `true`: correctness locks, each
    /// grant a token larger than every earlier one for its key
    /// ([`LockGuard::fencing_token`](crate::LockGuard::fencing_token)), for a resource that
    /// rejects a stale writer.
    ///
    /// `false` makes **efficiency locks**: locks that only save duplicate work (a job run once,
    /// a cache filled once), where a rare second holder after a pause costs work, not data.
    /// Their guards report token 0, which a fenced resource refuses. Waiting, the queue, FIFO,
    /// the watchdog and cancellation are unchanged. On Redis an uncontended acquire is one
    /// `SET NX PX` and a release deletes the key, as cheap on the server as a lock can be: see
    /// the [guide](crate::guide::kinds) for what a token costs and when to go without.
    /// Readers and permits keep their tokens.
    ///
    /// One Redis, Sentinel, Cluster and the in-process backend take it; Redlock, etcd,
    /// ZooKeeper, PostgreSQL and MySQL refuse it at [`build`](Self::build) (their tokens cost
    /// nothing extra, or Redlock's masters need one to agree on).
    ///
    /// ```
    /// let jobs = distlock::Backend::builder("memory://")
    ///     .fencing_tokens(false)
    ///     .build()
    ///     .expect("the in-process backend takes it");
    /// # let _ = jobs;
    /// let err = distlock::Backend::builder("redis://a:6379,redis://b:6379,redis://c:6379")
    ///     .fencing_tokens(false)
    ///     .build()
    ///     .unwrap_err();
    /// assert!(err.to_string().contains("fencing_tokens"), "{err}");
    /// ```
    pub fn fencing_tokens(mut self, on: bool) -> Self {
        self.fencing_tokens = on;
        self
    }

    /// How long one connection attempt may take. Default 1 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.timeouts.connect = timeout;
        self
    }

    /// Trust the CA certificate(s) in this PEM file for TLS connections (`rediss://`,
    /// `rediss-sentinel://`, `rediss-cluster://`, `etcds://`), instead of the web PKI roots.
    /// Default: the web PKI roots. The file is read here; a file that cannot be read, or holds
    /// no PEM block, makes [`build`](Self::build) fail naming it. Setting TLS files for a URL
    /// that is not a TLS one is an error too, never silently ignored (PostgreSQL takes
    /// `sslrootcert` in its URL). Needs the `tls` feature.
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        match read_pem(path.as_ref()) {
            Ok(pem) => self.tls.ca = Some(pem),
            Err(problem) => self.tls_error = Some(("tls_ca_file", problem)),
        }
        self
    }

    /// Trust these PEM-encoded CA certificate(s) (see [`tls_ca_file`](Self::tls_ca_file)).
    pub fn tls_ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls.ca = Some(pem.into());
        self
    }

    /// Present this client certificate (PEM chain) and private key (PEM) to servers that verify
    /// clients (Redis's `tls-auth-clients yes`, etcd's `--client-cert-auth`). Default: none.
    /// Read here, like
    /// [`tls_ca_file`](Self::tls_ca_file).
    pub fn tls_client_auth_files(
        mut self,
        certificate: impl AsRef<Path>,
        private_key: impl AsRef<Path>,
    ) -> Self {
        let cert = read_pem(certificate.as_ref());
        let key = read_pem(private_key.as_ref());
        match (cert, key) {
            (Ok(cert), Ok(key)) => self.tls.client = Some((cert, key)),
            (Err(problem), _) | (_, Err(problem)) => {
                self.tls_error = Some(("tls_client_auth_files", problem))
            }
        }
        self
    }
}

pub(crate) fn validate_prefix(prefix: &str) -> Result<(), LockError> {
    if prefix.is_empty() {
        return Err(LockError::invalid_config(
            "prefix",
            "is empty; give the keys a namespace such as `distlock` or `billing`",
        ));
    }
    if let Some(c) = prefix
        .chars()
        .find(|c| matches!(c, '{' | '}') || c.is_control())
    {
        return Err(LockError::invalid_config(
            "prefix",
            format!(
                "`{}` contains {c:?}; a prefix may not hold hash-tag braces or control characters",
                prefix.escape_debug()
            ),
        ));
    }
    Ok(())
}
