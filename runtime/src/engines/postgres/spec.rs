//! The PostgreSQL deployment as a builder holds it: the settings it refuses, and its engine —
//! the queue engine on a [`PgStore`].

use super::client::connect;
use super::sql::check_schema;
use super::store::PgStore;
use super::url::PgSpec;
use crate::engines::engine::{Deployment, Engine};
use crate::engines::queue::QueueEngine;
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{only_redlock, tokens_are_free, EngineSpec, Optional};
use crate::error::LockError;
use std::sync::Arc;

impl EngineSpec for PgSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Postgres
    }

    fn describe(&self) -> String {
        PgSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        match setting {
            Optional::Schema => None,
            Optional::Tls => Some(
                "a PostgreSQL database, which takes TLS the way its own clients do: \
                 `sslmode`, `sslrootcert`, `sslcert` and `sslkey` in the URL"
                    .into(),
            ),
            Optional::MinReplicas => Some(
                "a PostgreSQL database, which acknowledges a grant only once it is committed \
                 (with synchronous_standby_names, once a standby has it too); set it to 0"
                    .into(),
            ),
            Optional::MasterTimeout => Some(only_redlock(self)),
            Optional::Unfenced => Some(tokens_are_free(self, "its queue entries' places in line")),
        }
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        check_schema(settings.schema)?;
        let connection = connect(self.options.clone(), settings.timeouts, self.describe());
        let store = PgStore::new(
            connection,
            settings.schema,
            settings.create_schema,
            settings.prefix,
            settings.holder_label,
        );
        Ok(QueueEngine::open(store, settings))
    }
}
