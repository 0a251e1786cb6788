//! [`Backend::zookeeper`].

use super::url::{ZkSpec, ZOOKEEPER_PORT};
use crate::backend::{Backend, BackendBuilder};
use crate::engines::spec::EngineSpec;
use crate::util::hosts::{host_list, strings};
use std::sync::Arc;

impl Backend {
    /// A builder for a ZooKeeper ensemble, from its servers' client addresses (`host[:port]`,
    /// port 2181 by default; one reachable is enough, the client moves on when one fails): the
    /// same as [`Backend::builder`] with `zookeeper://host:port,…` (what `DISTLOCK_URL` takes;
    /// use that form for a chroot, a session timeout or credentials). Feature `zookeeper`.
    ///
    /// ```
    /// let servers = ["10.0.0.1:2181", "10.0.0.2:2181", "10.0.0.3:2181"];
    /// let backend = distlock::Backend::zookeeper(servers)
    ///     .prefix("billing")
    ///     .build()
    ///     .expect("three servers");
    /// # let _ = backend;
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "zookeeper")))]
    pub fn zookeeper<I, S>(servers: I) -> BackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let servers = host_list("servers", &strings(servers), ZOOKEEPER_PORT);
        BackendBuilder::new(servers.map(|servers| {
            Arc::new(ZkSpec {
                servers,
                chroot: "/".into(),
                session_timeout: None,
                username: None,
                password: None,
            }) as Arc<dyn EngineSpec>
        }))
    }
}
