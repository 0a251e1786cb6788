//! The etcd engine (`etcd://`, `etcds://` with TLS; feature `etcd`): locks on a consensus store, which keeps a
//! granted lock through the loss of any minority of its members and hands out a fencing token
//! that only grows across leader changes.
//!
//! A store of the queue engine (`engines/queue/`), which decides who holds, joins, wakes and
//! answers operators; this directory is what only etcd does (`store.rs`). A lock is a queue
//! of keys (`txns.rs`): each contender writes its own key bound to a lease, the oldest entry
//! holds the lock, and its creation revision is the fencing token. Waiters keep their places
//! and are woken by an etcd watch of the queue's deletions, so the lock passes in the order
//! they came, across processes.
//!
//! Leases (`leases.rs`): every grant and every renewal binds the entry to a lease with the
//! lock's TTL left (rounded up to whole seconds); the grants and renewals of one TTL share a
//! lease for up to a second. An entry nobody renews lapses with its lease, as a Redis key with
//! its TTL.

#[cfg(feature = "etcd")]
pub(crate) mod acl;
#[cfg(feature = "etcd")]
pub(crate) mod client;
#[cfg(feature = "etcd")]
mod constructors;
#[cfg(feature = "etcd")]
mod leases;
#[cfg(feature = "etcd")]
mod operator;
#[cfg(feature = "etcd")]
mod spec;
#[cfg(feature = "etcd")]
mod store;
#[cfg(feature = "etcd")]
mod txns;
#[cfg(feature = "etcd")]
mod url;

use crate::engines::spec::{Parser, Registration};

/// `etcd://` and `etcds://`: parsed in builds with the `etcd` feature, named as missing in the others.
pub(crate) const REGISTRATION: Registration = Registration {
    schemes: &["etcd", "etcds"],
    forms: "etcd[s]://host:port,…",
    #[cfg(feature = "etcd")]
    parser: Parser::Url(|url| Ok(std::sync::Arc::new(url::EtcdSpec::parse(url)?))),
    #[cfg(not(feature = "etcd"))]
    parser: Parser::Missing {
        feature: "etcd",
        what: "an etcd cluster",
    },
    list: None,
};
