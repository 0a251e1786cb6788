//! The MySQL deployment as a builder holds it: the settings it refuses, and its engine — the
//! queue engine on a [`MySqlStore`].

use super::client::connect;
use super::sql::check_schema;
use super::store::MySqlStore;
use super::url::MySqlSpec;
use crate::engines::engine::{Deployment, Engine};
use crate::engines::queue::QueueEngine;
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{only_redlock, tokens_are_free, EngineSpec, Optional};
use crate::error::LockError;
use std::sync::Arc;

/// Presences one process watches at once, each a connection blocked in the server: waiters
/// beyond that wait their turn for a connection, and meanwhile on their timers.
const WATCHES: u32 = 64;

impl EngineSpec for MySqlSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Mysql
    }

    fn describe(&self) -> String {
        MySqlSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        match setting {
            Optional::Schema => None,
            Optional::Tls => Some(
                "a MySQL database, which takes TLS the way sqlx's MySQL client does: `ssl-mode`, \
                 `ssl-ca`, `ssl-cert` and `ssl-key` in the URL"
                    .into(),
            ),
            Optional::MinReplicas => Some(
                "a MySQL database, which acknowledges a grant once it is committed (with \
                 semi-synchronous replication, once a replica has it too); set it to 0"
                    .into(),
            ),
            Optional::MasterTimeout => Some(only_redlock(self)),
            Optional::Unfenced => Some(tokens_are_free(self, "its queue entries' places in line")),
        }
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        check_schema(settings.schema)?;
        let connection = connect(self.options.clone(), settings.timeouts, self.describe());
        let watches =
            connect(self.options.clone(), settings.timeouts, self.describe()).with_size(WATCHES);
        let store = MySqlStore::new(
            connection,
            watches,
            settings.schema,
            settings.create_schema,
            settings.prefix,
            settings.holder_label,
        );
        Ok(QueueEngine::open(store, settings))
    }
}
