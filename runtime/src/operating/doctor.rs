//! [`Backend::doctor`](crate::Backend::doctor): settings of the lock server that quietly weaken
//! locks. Each engine judges its own servers (`engines/redis/doctor.rs`, etcd's operator); a
//! finding names its [`Check`].

use std::fmt;

/// One thing the doctor found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// What was checked.
    pub check: Check,
    /// What is wrong, why it matters for locks, and what to do.
    pub advice: String,
}

/// What a [`Finding`] is about.
///
/// ```
/// use distlock::Check;
///
/// assert_eq!(Check::ReplicaLag.to_string(), "replica-lag");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Check {
    /// The server may evict keys under memory pressure (`maxmemory-policy` other than
    /// `noeviction`): a lock can vanish.
    Eviction,
    /// The server keeps nothing on disk: a restart forgets every lock.
    Persistence,
    /// A replica acknowledged too long ago: a failover now would lose recent grants.
    ReplicaLag,
    /// Fewer replicas online than `min_replicas` needs, or exactly as many (none to spare for a
    /// failover).
    Replicas,
    /// A server older than distlock supports.
    Version,
    /// The user may not run what locks need.
    Acl,
    /// Something could not be checked: the user may not read it.
    Unchecked,
    /// A server did not answer (a Redlock master).
    Unreachable,
    /// The etcd member answering has no leader.
    Leader,
    /// The database server answering is a standby (read-only).
    Standby,
    /// The ZooKeeper session is too short for the watchdog's lease.
    Session,
}

impl Check {
    /// Its stable name: `eviction`, `persistence`, `replica-lag`, `replicas`, `version`, `acl`,
    /// `unchecked`, `unreachable`, `leader`, `standby` or `session` (what the CLI prints and its JSON
    /// holds).
    pub const fn as_str(self) -> &'static str {
        match self {
            Check::Eviction => "eviction",
            Check::Persistence => "persistence",
            Check::ReplicaLag => "replica-lag",
            Check::Replicas => "replicas",
            Check::Version => "version",
            Check::Acl => "acl",
            Check::Unchecked => "unchecked",
            Check::Unreachable => "unreachable",
            Check::Leader => "leader",
            Check::Standby => "standby",
            Check::Session => "session",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.advice)
    }
}
