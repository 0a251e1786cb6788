//! Everything Redis: its four deployments (`deployments.rs`: one server or a primary behind
//! Sentinel, `single.rs` and `sentinel.rs`; a Cluster, `cluster.rs`; Redlock, `redlock/`), the
//! Lua scripts (`scripts/`) and the protocol they speak (`protocol/`), a [`node::Node`] per server
//! (connection, scripts by SHA, typed lock scripts), a pub/sub [`pubsub::Subscriber`] per
//! server, the doctor's judgement (`doctor.rs`), errors with advice (`diagnose.rs`), and what
//! only Redis users get: the ACL rules (`acl.rs`) and `FencedStore` (`fenced.rs`).

pub(crate) mod acl;
pub(crate) mod alive;
pub(crate) mod batches;
pub(crate) mod cluster;
pub(crate) mod cluster_operator;
pub(crate) mod cluster_spec;
pub(crate) mod conditional;
mod constructors;
pub(crate) mod deployments;
pub(crate) mod diagnose;
pub(crate) mod doctor;
pub(crate) mod fenced;
pub(crate) mod group_commit;
pub(crate) mod handover_channel;
pub(crate) mod keyspace;
pub(crate) mod node;
pub(crate) mod protocol;
pub(crate) mod pubsub;
pub(crate) mod redlock;
pub(crate) mod scan;
pub(crate) mod scripts;
pub(crate) mod sentinel;
pub(crate) mod sharded;
pub(crate) mod single;
pub(crate) mod slot;
pub(crate) mod tls;
