//! The lock engines (see [`crate::engines::engine::Engine`]): one Redis server, Redlock over several, an
//! etcd cluster (feature `etcd`), and the in-process map. Each is built by its own constructor and handed to a
//! [`Backend`](crate::Backend) by the builder.

pub(crate) mod engine;
#[cfg(feature = "etcd")]
pub(crate) mod etcd;
pub(crate) mod in_process;
pub(crate) mod redis;
pub(crate) mod timeouts;
