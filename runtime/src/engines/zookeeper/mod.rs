//! The ZooKeeper engine (`zookeeper://`; feature `zookeeper`): locks on a consensus store, as
//! ZooKeeper's own lock recipe takes them, on the queue engine (`engines/queue/`), which decides
//! who holds, joins, wakes and answers operators; this directory is what only ZooKeeper does.
//!
//! A lock is a container node whose children are its queue (`nodes.rs`): each contender makes
//! an ephemeral sequential child named after its owner, the oldest holds the lock, and the
//! child's creation zxid is the fencing token — global to the ensemble, 64 bits, and growing
//! across leader elections, unlike the sequence number, which is the child's place only. A
//! waiter watches the one entry whose going may let it hold (`wakes.rs`), so a release wakes
//! the next waiter and nobody else, across processes.
//!
//! Leases (`store.rs`, `mine.rs`): an entry goes with its session, and this process deletes it
//! once its lease has run out unrenewed. A renewal is a `sync` answered by the leader, which
//! proves the session alive there, and a read of each entry, with no write; a lease may last at
//! most three quarters of the session timeout, so that a holder cut off from the ensemble sees
//! its lease end before the ensemble may end its session and grant the lock to the next.

#[cfg(feature = "zookeeper")]
mod client;
#[cfg(feature = "zookeeper")]
mod constructors;
#[cfg(feature = "zookeeper")]
mod mine;
#[cfg(feature = "zookeeper")]
mod nodes;
#[cfg(feature = "zookeeper")]
mod operator;
#[cfg(feature = "zookeeper")]
mod spec;
#[cfg(feature = "zookeeper")]
mod store;
#[cfg(feature = "zookeeper")]
mod url;
#[cfg(feature = "zookeeper")]
mod wakes;

use crate::engines::spec::{Parser, Registration};

/// `zookeeper://`: parsed in builds with the `zookeeper` feature, named as missing in the others.
pub(crate) const REGISTRATION: Registration = Registration {
    schemes: &["zookeeper"],
    forms: "zookeeper://host:port,…[/chroot]",
    #[cfg(feature = "zookeeper")]
    parser: Parser::Url(|url| Ok(std::sync::Arc::new(url::ZkSpec::parse(url)?))),
    #[cfg(not(feature = "zookeeper"))]
    parser: Parser::Missing {
        feature: "zookeeper",
        what: "a ZooKeeper ensemble",
    },
    list: None,
};
