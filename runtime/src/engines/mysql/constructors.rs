//! [`Backend::mysql`].

use super::url::MySqlSpec;
use crate::backend::{Backend, BackendBuilder};
use crate::engines::spec::EngineSpec;
use std::sync::Arc;

impl Backend {
    /// A builder for locks in the MySQL or MariaDB server of the application's own pool: the
    /// same server, user and TLS settings (its connect options), on a few connections of
    /// distlock's own, so that a body holding every connection of the application's pool
    /// cannot keep its lock from being renewed. The lock tables live in a database of their own
    /// ([`schema`](BackendBuilder::schema), `distlock` unless set). The same as
    /// [`Backend::builder`] with a `mysql://` URL. Feature `mysql`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::MySqlPool::connect("mysql://app@db.internal/orders").await?;
    /// let backend = distlock::Backend::mysql(&pool).connect().await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
    pub fn mysql(pool: &sqlx::MySqlPool) -> BackendBuilder {
        let spec = MySqlSpec {
            options: (*pool.connect_options()).clone(),
        };
        BackendBuilder::new(Ok(Arc::new(spec) as Arc<dyn EngineSpec>))
    }
}
