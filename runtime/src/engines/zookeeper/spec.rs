//! The ZooKeeper deployment as a builder holds it: the settings it refuses, and its engine — the
//! queue engine on a [`ZkStore`].

use super::client::Connection;
use super::store::ZkStore;
use super::url::ZkSpec;
use crate::engines::engine::{Deployment, Engine};
use crate::engines::queue::QueueEngine;
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{not_a_database, only_redlock, tokens_are_free, EngineSpec, Optional};
use crate::error::LockError;
use std::sync::Arc;
use std::time::Duration;

impl EngineSpec for ZkSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Zookeeper
    }

    fn describe(&self) -> String {
        ZkSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        Some(match setting {
            Optional::Tls => "a zookeeper:// URL, which distlock connects to without TLS; drop \
                              the TLS settings"
                .into(),
            Optional::MinReplicas => "a ZooKeeper ensemble, whose writes are committed by a \
                                      majority of its servers before they are answered; set it \
                                      to 0"
                .into(),
            Optional::MasterTimeout => only_redlock(self),
            Optional::Schema => not_a_database(self),
            Optional::Unfenced => tokens_are_free(self, "the sequence numbers of its entries"),
        })
    }

    /// The session asked for covers the watchdog's lease with an eighth to spare: its timeout
    /// is the URL's, else three halves of the watchdog lease (a lease may last three quarters
    /// of the session), rounded up to the whole milliseconds ZooKeeper counts in.
    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        let covering = (settings.watchdog_lease.as_micros() * 3).div_ceil(2 * 1000);
        let session = self
            .session_timeout
            .unwrap_or(Duration::from_millis(covering as u64));
        let connection = Connection::new(self.clone(), session, settings.timeouts);
        let store = ZkStore::new(
            connection,
            settings.prefix,
            settings.holder_label,
            settings.watchdog_lease,
        );
        Ok(QueueEngine::open(store, settings))
    }
}
