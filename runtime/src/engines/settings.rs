//! What every engine is made with: the backend's settings that reach the servers (the prefix,
//! the holder label, timeouts, TLS files, replica acknowledgement), read and checked by
//! [`BackendBuilder::build`](crate::BackendBuilder::build) before any engine sees them.

use crate::hooks::SharedHooks;
use std::fmt;
use std::path::Path;
use std::time::Duration;

/// The settings an engine is opened with ([`EngineSpec::open`](super::spec::EngineSpec::open)).
pub(crate) struct EngineSettings<'a> {
    /// The namespace of every key.
    pub(crate) prefix: &'a str,
    /// Who this process is, written with every lock it takes.
    pub(crate) holder_label: &'a str,
    /// How long a freed lock's token marker stays (Redis).
    pub(crate) marker_ttl: Duration,
    pub(crate) timeouts: Timeouts,
    /// Certificates; only deployments that take the TLS settings see any set.
    pub(crate) tls: &'a TlsFiles,
    /// Replicas that must acknowledge a grant; `None` when off, and for every deployment that
    /// refuses the setting.
    pub(crate) replicas: Option<Replicas>,
    /// Redlock's per-master timeout, when set (refused by every other deployment).
    pub(crate) master_timeout: Option<Duration>,
    /// The fraction of a lease taken off its validity for clock drift.
    pub(crate) drift_factor: f64,
    /// The TTL of watchdog leases (bounds that depend on it: a timeout under a third of it).
    pub(crate) watchdog_lease: Duration,
    /// A waiter's longest sleep, which sets how long a queued place lasts without asking.
    pub(crate) max_backoff: Duration,
    /// The backend's test hooks (zero-sized without them).
    pub(crate) hooks: &'a SharedHooks,
    /// A database's schema for the lock tables (`distlock` unless set).
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) schema: &'a str,
    /// Whether a database engine creates its schema when it is missing.
    #[cfg_attr(not(any(feature = "postgres", feature = "mysql")), allow(dead_code))]
    pub(crate) create_schema: bool,
    /// Exclusive locks carry fencing tokens; `false` (efficiency locks) only where the
    /// deployment takes it.
    pub(crate) fenced: bool,
}

/// Replica acknowledgement: a grant or renewal counts once `count` replicas confirmed it
/// within `timeout`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub(crate) count: u32,
    pub(crate) timeout: Duration,
}

/// Network timeouts of a connection to a lock server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            response: Duration::from_millis(500),
            connect: Duration::from_secs(1),
        }
    }
}

/// Certificates in PEM form, read when the backend is built.
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// CA certificate(s) that sign the server's certificate.
    pub(crate) ca: Option<Vec<u8>>,
    /// The client's certificate chain and private key.
    pub(crate) client: Option<(Vec<u8>, Vec<u8>)>,
}

/// Certificates and keys are never printed, only whether they are set.
impl fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.as_ref().map(|_| "<set>"))
            .field("client", &self.client.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl TlsFiles {
    pub(crate) fn is_set(&self) -> bool {
        self.ca.is_some() || self.client.is_some()
    }
}

/// Reads a PEM file; the problem, if any, names the path (the caller names the setting).
pub(crate) fn read_pem(path: &Path) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path)
        .map_err(|err| format!("names `{}`, which cannot be read: {err}", path.display()))?;
    if !pem.windows(11).any(|window| window == b"-----BEGIN ") {
        return Err(format!(
            "names `{}`, which holds no PEM block (`-----BEGIN …`)",
            path.display()
        ));
    }
    Ok(pem)
}
