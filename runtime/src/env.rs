//! The environment variables [`Registry::global`](crate::Registry::global) reads to configure the
//! `"default"` backend when none was registered: one per [`BackendBuilder`](crate::BackendBuilder)
//! setting, named after it.
//!
//! ```
//! assert_eq!(distlock::env::URL, "DISTLOCK_URL");
//! assert_eq!(distlock::env::WATCHDOG_LEASE, "DISTLOCK_WATCHDOG_LEASE");
//! ```

/// Where the backend lives: a URL [`Backend::builder`](crate::Backend::builder) takes (every form
/// is in [the configuration chapter](crate::guide::configuration)).
pub const URL: &str = "DISTLOCK_URL";
/// TTL of watchdog leases, a duration such as `30s` or `1500ms`; at least 100 ms; default 30 s.
/// See [`BackendBuilder::watchdog_lease`](crate::BackendBuilder::watchdog_lease).
pub const WATCHDOG_LEASE: &str = "DISTLOCK_WATCHDOG_LEASE";
/// Key namespace; default `distlock`.
pub const PREFIX: &str = "DISTLOCK_PREFIX";
/// Replicas that must acknowledge each grant and renewal (`WAIT`), a whole number; default 0
/// (off). See [`BackendBuilder::min_replicas`](crate::BackendBuilder::min_replicas).
pub const MIN_REPLICAS: &str = "DISTLOCK_MIN_REPLICAS";
/// How long a grant or renewal waits for the replicas, a duration such as `200ms`; default
/// 200 ms, or a quarter of the watchdog lease when that is less. See
/// [`BackendBuilder::replica_timeout`](crate::BackendBuilder::replica_timeout).
pub const REPLICA_TIMEOUT: &str = "DISTLOCK_REPLICA_TIMEOUT";
/// For TLS URLs (`rediss://`, `rediss-sentinel://`, `rediss-cluster://`, `etcds://`): a PEM
/// file of the CA certificate(s) to trust instead of the web PKI roots. (PostgreSQL takes
/// `sslrootcert` in its URL.)
pub const TLS_CA_FILE: &str = "DISTLOCK_TLS_CA_FILE";
/// For TLS URLs whose servers verify clients: the client's certificate (PEM); needs
/// [`TLS_KEY_FILE`] too. (PostgreSQL takes `sslcert` and `sslkey` in its URL.)
pub const TLS_CERT_FILE: &str = "DISTLOCK_TLS_CERT_FILE";
/// The private key (PEM) of [`TLS_CERT_FILE`].
pub const TLS_KEY_FILE: &str = "DISTLOCK_TLS_KEY_FILE";
/// Who this process is, written with every lock it takes (default `hostname:pid`; empty: none).
/// See [`BackendBuilder::holder_label`](crate::BackendBuilder::holder_label).
pub const HOLDER_LABEL: &str = "DISTLOCK_HOLDER_LABEL";

/// How long a reply may take before it counts as lost, e.g. `500ms`. See
/// [`BackendBuilder::response_timeout`](crate::BackendBuilder::response_timeout).
pub const RESPONSE_TIMEOUT: &str = "DISTLOCK_RESPONSE_TIMEOUT";
/// How long one connection attempt may take, e.g. `1s`. See
/// [`BackendBuilder::connect_timeout`](crate::BackendBuilder::connect_timeout).
pub const CONNECT_TIMEOUT: &str = "DISTLOCK_CONNECT_TIMEOUT";
/// Redlock: how long one master may take, e.g. `50ms`. See
/// [`BackendBuilder::master_timeout`](crate::BackendBuilder::master_timeout).
pub const MASTER_TIMEOUT: &str = "DISTLOCK_MASTER_TIMEOUT";
/// The longest sleep of a waiter between tries, e.g. `100ms`. See
/// [`BackendBuilder::max_backoff`](crate::BackendBuilder::max_backoff).
pub const MAX_BACKOFF: &str = "DISTLOCK_MAX_BACKOFF";
/// How long a process passes a busy key among its own tasks, e.g. `1ms`. See
/// [`BackendBuilder::local_batch`](crate::BackendBuilder::local_batch).
pub const LOCAL_BATCH: &str = "DISTLOCK_LOCAL_BATCH";
/// How long a freed lock's token marker stays, e.g. `1h`. See
/// [`BackendBuilder::marker_ttl`](crate::BackendBuilder::marker_ttl).
pub const MARKER_TTL: &str = "DISTLOCK_MARKER_TTL";
/// The fraction of a lease taken off for clock drift, e.g. `0.01`. See
/// [`BackendBuilder::clock_drift_factor`](crate::BackendBuilder::clock_drift_factor).
pub const CLOCK_DRIFT_FACTOR: &str = "DISTLOCK_CLOCK_DRIFT_FACTOR";
/// Most leases renewed by one script call, e.g. `256`. See
/// [`BackendBuilder::renew_batch`](crate::BackendBuilder::renew_batch).
pub const RENEW_BATCH: &str = "DISTLOCK_RENEW_BATCH";
/// The longest key in bytes, e.g. `512`. See
/// [`BackendBuilder::max_key_len`](crate::BackendBuilder::max_key_len).
pub const MAX_KEY_LEN: &str = "DISTLOCK_MAX_KEY_LEN";
/// A database's schema for the lock tables, e.g. `locks`. See
/// [`BackendBuilder::schema`](crate::BackendBuilder::schema).
pub const SCHEMA: &str = "DISTLOCK_SCHEMA";
/// `true` (or `1`) to create a database's schema at first use when it is missing; `false` (or
/// `0`, the default) to report it missing. See
/// [`BackendBuilder::create_schema`](crate::BackendBuilder::create_schema).
pub const CREATE_SCHEMA: &str = "DISTLOCK_CREATE_SCHEMA";
/// `false` (or `0`) for efficiency locks, without fencing tokens; `true` (or `1`, the default)
/// for tokens. See [`BackendBuilder::fencing_tokens`](crate::BackendBuilder::fencing_tokens).
pub const FENCING_TOKENS: &str = "DISTLOCK_FENCING_TOKENS";
