//! [`Backend::postgres`].

use super::url::PgSpec;
use crate::backend::{Backend, BackendBuilder};
use crate::engines::spec::EngineSpec;
use std::sync::Arc;

impl Backend {
    /// A builder for locks in the PostgreSQL database of the application's own pool: the same
    /// server, database, user and TLS settings (its connect options), on a few connections of
    /// distlock's own, so that a body holding every connection of the application's pool
    /// cannot keep its lock from being renewed. The same as [`Backend::builder`] with a
    /// `postgres://` URL. Feature `postgres`.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let pool = sqlx::PgPool::connect("postgres://app@db.internal/orders").await?;
    /// let backend = distlock::Backend::postgres(&pool)
    ///     .schema("locks")
    ///     .connect()
    ///     .await?;
    /// # let _ = backend;
    /// # Ok(())
    /// # }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
    pub fn postgres(pool: &sqlx::PgPool) -> BackendBuilder {
        let spec = PgSpec {
            options: (*pool.connect_options()).clone(),
        };
        BackendBuilder::new(Ok(Arc::new(spec) as Arc<dyn EngineSpec>))
    }
}
