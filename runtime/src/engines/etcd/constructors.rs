//! [`Backend::etcd`].

use super::url::{EtcdSpec, ETCD_PORT};
use crate::backend::{Backend, BackendBuilder};
use crate::engines::spec::EngineSpec;
use crate::util::hosts::{host_list, strings};
use std::sync::Arc;

impl Backend {
    /// A builder for an etcd cluster, from its members' client addresses (`host[:port]`, port
    /// 2379 by default; one reachable is enough, the client moves on when one fails): the same
    /// as [`Backend::builder`] with `etcd://host:port,…` (what `DISTLOCK_URL` takes; use that
    /// form for credentials, and `etcds://host:port,…` for TLS). Feature `etcd`.
    ///
    /// ```
    /// let backend = distlock::Backend::etcd(["10.0.0.1:2379", "10.0.0.2:2379", "10.0.0.3:2379"])
    ///     .prefix("billing")
    ///     .build()
    ///     .expect("three members");
    /// # let _ = backend;
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
    pub fn etcd<I, S>(members: I) -> BackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let endpoints = host_list("members", &strings(members), ETCD_PORT);
        BackendBuilder::new(endpoints.map(|endpoints| {
            Arc::new(EtcdSpec {
                endpoints,
                secure: false,
                username: None,
                password: None,
            }) as Arc<dyn EngineSpec>
        }))
    }
}
