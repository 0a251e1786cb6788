//! The etcd deployment as a builder holds it: the settings it refuses, and its engine — the
//! queue engine on an [`EtcdStore`].

use super::store::EtcdStore;
use super::url::EtcdSpec;
use crate::engines::engine::{Deployment, Engine};
use crate::engines::queue::QueueEngine;
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{not_a_database, only_redlock, tokens_are_free, EngineSpec, Optional};
use crate::error::LockError;
use std::sync::Arc;

impl EngineSpec for EtcdSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Etcd
    }

    fn describe(&self) -> String {
        EtcdSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        Some(match setting {
            Optional::Tls if self.secure => return None,
            Optional::Tls => "an etcd:// URL, which is not encrypted; use etcds:// to connect \
                              with TLS, or drop the TLS settings"
                .into(),
            Optional::MinReplicas => "an etcd cluster, whose writes are committed by a majority \
                                      of its members before they are answered; set it to 0"
                .into(),
            Optional::MasterTimeout => only_redlock(self),
            Optional::Schema => not_a_database(self),
            Optional::Unfenced => tokens_are_free(self, "the revisions of its writes"),
        })
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        let store = EtcdStore::new(
            self,
            settings.tls,
            settings.prefix,
            settings.timeouts,
            settings.holder_label,
        );
        Ok(QueueEngine::open(store, settings))
    }
}
