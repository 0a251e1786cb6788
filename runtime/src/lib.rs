//! # distlock
//!
//! Distributed locks from one attribute, on Redis (one server, Sentinel, Cluster, Redlock), etcd,
//! ZooKeeper, PostgreSQL, MySQL or in the process, with fencing tokens a resource can check.
//!
//! ```
//! use distlock::{distributed_lock, Backend, LockError, Registry};
//!
//! #[derive(Debug)]
//! enum PayError {
//!     Lock(LockError),
//! }
//!
//! impl From<LockError> for PayError {
//!     fn from(err: LockError) -> Self {
//!         PayError::Lock(err)
//!     }
//! }
//!
//! #[distributed_lock(key = "order:<id>", wait = "1s", lease = "watchdog")]
//! async fn pay(id: u64, amount: u64) -> Result<u64, PayError> {
//!     let token = distlock::fencing_token().expect("inside the lock");
//!     // …write to the ledger with `token`, which must reject older tokens…
//!     Ok(amount + token * 0)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), PayError> {
//! Registry::global().register("default", Backend::in_process())?;
//! assert_eq!(pay(7, 100).await?, 100);
//! # Ok(())
//! # }
//! ```
//!
//! ## What the attribute does
//! It expands the function into: acquire (on Redis, one round trip: a script that sets the lock if
//! absent, with a TTL, and issues a fencing token), wait if it is busy (woken by the release, with
//! jittered backoff as a safety net), run the body while the backend's watchdog renews the lease
//! and the body is stopped between steps if the lease is lost, then release, checking ownership,
//! on return, `?`, panic or cancellation. The same machinery is available by hand through
//! [`Lock`].
//!
//! ## The guide
//! | chapter | answers |
//! |---|---|
//! | [attribute](guide::attribute) | `#[distributed_lock]`: keys, waiting, leases, a lost lease |
//! | [Lock API](guide::lock_api) | [`Lock`] and [`LockGuard`]: the same locks by hand |
//! | [configuration](guide::configuration) | every URL form, environment variable and feature |
//! | [**choosing a deployment**](guide::deployments) | what each deployment survives, loses and costs |
//! | [lock kinds](guide::kinds) | read/write locks and semaphores |
//! | [fencing](guide::fencing) | making a lock exact: tokens the resource checks |
//! | [operating](guide::operating) | the CLI, metrics, tracing, readiness and shutdown |
//! | [testing](guide::testing) | testing your own code without a server |
//! | [cancellation](guide::cancellation) | what a dropped call leaves behind |
//!
//! ## Guarantees, and their limits
//! - A lock is released only by its owner (a fresh 20-byte random token per acquisition).
//! - Fencing tokens of exclusive and write locks strictly increase per key, even after the token
//!   marker a release leaves is lost, as long as the server's clock does not step back by more
//!   than a lease.
//! - Validity is tracked locally on a monotonic clock: a paused process learns at its next
//!   [`checkpoint()`] that its lease is gone.
//! - A dropped call is released in the background: within about one round trip when the server
//!   answers, otherwise by its lease's end ([cancellation](guide::cancellation)).
//! - A lock alone is only approximately exclusive: a holder paused past its lease may still act,
//!   and an asynchronously replicated Redis can grant a lock twice in a failover. Exactness needs
//!   the resource to check fencing tokens ([`redis::FencedStore`], [fencing](guide::fencing)) and, for
//!   data, a deployment that keeps grants through a failover ([deployments](guide::deployments)).
//!
//! ## Features
//! | feature | adds |
//! |---|---|
//! | `tls` | TLS through rustls: `rediss://`, `rediss-sentinel://`, `rediss-cluster://`, `etcds://` URLs, PostgreSQL's `sslmode` |
//! | `etcd` | `etcd://` URLs and `Backend::etcd`: locks on an etcd cluster (building it needs `protoc`) |
//! | `postgres` | `postgres://` URLs, `Backend::postgres(&pool)` and `distlock::postgres`: locks in a PostgreSQL database, and fenced writes in the application's own transaction |
//! | `mysql` | `mysql://` URLs, `Backend::mysql(&pool)` and `distlock::mysql`: locks in a MySQL 8.0+ or MariaDB 10.6+ database, and fenced writes in the application's own transaction |
//! | `zookeeper` | `zookeeper://` URLs and `Backend::zookeeper`: locks on a ZooKeeper 3.6+ ensemble, the node's creation zxid as the fencing token |
//! | `metrics` | counters, histograms and gauges on the [`metrics`](https://docs.rs/metrics) facade, and `describe_metrics` |
//! | `axum` | `impl IntoResponse for LockError`: 409 when busy (with `Retry-After` when the server said how long the holder has left), 503 when the backend is unavailable, 500 otherwise |
//!
//! None is on by default; without one, its dependencies are not built.
//!
//! ## Runtime
//! distlock runs on [tokio](https://docs.rs/tokio) only: its async functions must be awaited
//! inside a tokio runtime (with the time driver on), and panic outside one.
#![forbid(unsafe_code)]
// docs.rs builds with `--cfg docsrs`: items behind a feature say which one.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs, unreachable_pub, rust_2018_idioms)]
// Every function reads top to bottom in one screen (the threshold is in clippy.toml).
#![warn(clippy::too_many_lines)]

mod backend;
mod engines;
pub mod env;
mod error;
pub mod guide;
mod hooks;
mod lock;
mod operating;
pub mod testing;
mod util;
mod wait;
#[cfg(feature = "axum")]
mod web;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;

/// What only the Redis deployments have: the fenced write a resource on Redis checks tokens
/// with ([`FencedStore`](redis::FencedStore), and its script for your own connection), and the
/// ACL rules a Redis user needs to take locks.
pub mod redis {
    pub use crate::engines::redis::acl::{acl_rules, cluster_acl_rules};
    pub use crate::engines::redis::fenced::{FencedStore, FencedWrite};
    pub use crate::engines::redis::scripts::FENCED_SET_LUA;
}

/// What only the etcd deployment has (feature `etcd`): the rights its lock user needs.
#[cfg(feature = "etcd")]
#[cfg_attr(docsrs, doc(cfg(feature = "etcd")))]
pub mod etcd {
    pub use crate::engines::etcd::acl::{acl_commands, key_prefix};
}

/// What only the PostgreSQL deployment has (feature `postgres`): the fenced write inside the
/// application's own transaction, and the schema of the lock tables.
///
/// A lock's lease row in the database is also the proof that the lock is held:
/// [`fence`](crate::postgres::fence) reads it inside the application's transaction and locks it
/// until the transaction ends, so the transaction commits only while the lock is this
/// holder's — a paused holder's late write fails instead of committing over its successor's.
/// Without it, a resource needs the fencing token check of [the fencing
/// chapter](crate::guide::fencing).
///
/// ```no_run
/// use distlock::{distributed_lock, LockError};
///
/// #[derive(Debug)]
/// enum PayError {
///     Lock(LockError),
///     Db(sqlx::Error),
/// }
/// impl From<LockError> for PayError {
///     fn from(err: LockError) -> Self { PayError::Lock(err) }
/// }
/// impl From<sqlx::Error> for PayError {
///     fn from(err: sqlx::Error) -> Self { PayError::Db(err) }
/// }
///
/// #[distributed_lock(key = "account:<id>", wait = "1s")]
/// async fn debit(pool: &sqlx::PgPool, id: i64, amount: i64) -> Result<(), PayError> {
///     let mut tx = pool.begin().await?;
///     distlock::postgres::fence(&mut tx).await?; // commits only while the lock is held
///     sqlx::query("UPDATE accounts SET balance = balance - $1 WHERE id = $2")
///         .bind(amount)
///         .bind(id)
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use crate::engines::postgres::fence::{fence, fence_guard};

    /// The SQL that creates the lock tables in `schema` (`distlock` by default; see
    /// [`BackendBuilder::schema`](crate::BackendBuilder::schema)): a schema, a sequence, two
    /// tables and the functions the engine calls, every statement idempotent. What
    /// `distlock schema postgres` prints, for the application's migrations.
    ///
    /// ```
    /// let sql = distlock::postgres::schema("distlock").unwrap();
    /// assert!(sql.contains("CREATE TABLE IF NOT EXISTS distlock.entries"));
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) when `schema` is not a
    /// lowercase SQL identifier.
    pub fn schema(schema: &str) -> Result<String, crate::LockError> {
        crate::engines::postgres::sql::check_schema(schema)?;
        Ok(crate::engines::postgres::sql::schema_sql(schema))
    }

    /// The GRANTs that give the role `user` what locks in `schema` need, and nothing more:
    /// `USAGE` on the schema, reads and writes on its two tables, `USAGE` on its sequence,
    /// `EXECUTE` on its functions. What `distlock acl postgres` prints; a user without one of
    /// them gets an error from [`Backend::ping`](crate::Backend::ping) that names this.
    ///
    /// ```
    /// let sql = distlock::postgres::grants("distlock", "locker").unwrap();
    /// assert!(sql.contains("GRANT USAGE ON SEQUENCE distlock.tokens TO \"locker\";"));
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) when `schema` is not a
    /// lowercase SQL identifier.
    pub fn grants(schema: &str, user: &str) -> Result<String, crate::LockError> {
        crate::engines::postgres::sql::check_schema(schema)?;
        Ok(crate::engines::postgres::sql::grants_sql(schema, user))
    }
}

/// What only the MySQL deployment has (feature `mysql`): the fenced write inside the
/// application's own transaction, and the schema of the lock tables. The same model as
/// [`postgres`]: a lock's lease row is the proof that it is held, and
/// [`fence`](crate::mysql::fence) locks it (`LOCK IN SHARE MODE`) inside the application's
/// transaction, so the transaction commits only while the lock is this holder's.
///
/// ```no_run
/// use distlock::{distributed_lock, LockError};
///
/// #[derive(Debug)]
/// enum PayError {
///     Lock(LockError),
///     Db(sqlx::Error),
/// }
/// impl From<LockError> for PayError {
///     fn from(err: LockError) -> Self { PayError::Lock(err) }
/// }
/// impl From<sqlx::Error> for PayError {
///     fn from(err: sqlx::Error) -> Self { PayError::Db(err) }
/// }
///
/// #[distributed_lock(key = "account:<id>", wait = "1s")]
/// async fn debit(pool: &sqlx::MySqlPool, id: i64, amount: i64) -> Result<(), PayError> {
///     let mut tx = pool.begin().await?;
///     distlock::mysql::fence(&mut tx).await?; // commits only while the lock is held
///     sqlx::query("UPDATE accounts SET balance = balance - ? WHERE id = ?")
///         .bind(amount)
///         .bind(id)
///         .execute(&mut *tx)
///         .await?;
///     tx.commit().await?;
///     Ok(())
/// }
/// ```
#[cfg(feature = "mysql")]
#[cfg_attr(docsrs, doc(cfg(feature = "mysql")))]
pub mod mysql {
    pub use crate::engines::mysql::fence::{fence, fence_guard};

    /// The SQL that creates the lock tables in the database `schema` (`distlock` by default;
    /// see [`BackendBuilder::schema`](crate::BackendBuilder::schema)): the database, two tables
    /// and the procedures the engine calls (between `DELIMITER` lines, for the `mysql` and
    /// `mariadb` clients), every statement idempotent. What `distlock schema mysql` prints,
    /// for the application's migrations.
    ///
    /// ```
    /// let sql = distlock::mysql::schema("distlock").unwrap();
    /// assert!(sql.contains("CREATE TABLE IF NOT EXISTS distlock.entries"));
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) when `schema` is not a
    /// lowercase SQL identifier.
    pub fn schema(schema: &str) -> Result<String, crate::LockError> {
        crate::engines::mysql::sql::check_schema(schema)?;
        Ok(crate::engines::mysql::sql::schema_sql(schema))
    }

    /// The GRANTs that give the account `user` (`name`, for any host, or `'name'@'host'`)
    /// what locks in `schema` need, and nothing more: reads and writes on its two tables,
    /// `EXECUTE` on its procedures. What `distlock acl mysql` prints; a user without one of
    /// them gets an error from [`Backend::ping`](crate::Backend::ping) that names this.
    ///
    /// ```
    /// let sql = distlock::mysql::grants("distlock", "locker").unwrap();
    /// assert!(sql.contains("GRANT EXECUTE ON distlock.* TO 'locker'@'%';"));
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`](crate::LockError::InvalidConfig) when `schema` is not a
    /// lowercase SQL identifier.
    pub fn grants(schema: &str, user: &str) -> Result<String, crate::LockError> {
        crate::engines::mysql::sql::check_schema(schema)?;
        Ok(crate::engines::mysql::sql::grants_sql(schema, user))
    }
}

pub use backend::registry::{Registry, DEFAULT_BACKEND};
pub use backend::{Backend, BackendBuilder, MIN_LEASE, SHUTDOWN_TIMEOUT};
pub use engines::engine::{Deployment, Holder};
pub use error::{BackendError, LockError, LostReason, Operation};
pub use lock::context::{checkpoint, fencing_token, is_held};
pub use lock::guard::LockGuard;
pub use lock::kind::LockKind;
pub use lock::policy::{Lease, OnLost, Wait};
pub use lock::release::Released;
pub use lock::Lock;
pub use operating::doctor::{Check, Finding};
pub use operating::key_events::Notifications;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub use operating::metrics::describe_metrics;
pub use operating::operator::{HeldLock, LockEvent, LockEventKind, LockEvents};
pub use operating::stats::{StatsSnapshot, WAIT_BUCKETS};

/// # Example that runs
///
/// ```
/// use distlock::{distributed_lock, Backend, LockError, Registry};
///
/// #[derive(Debug)]
/// struct JobError(LockError);
///
/// impl From<LockError> for JobError {
///     fn from(err: LockError) -> Self {
///         JobError(err)
///     }
/// }
///
/// struct Job {
///     id: u64,
/// }
///
/// /// Renders `job:<job.id>` from a borrow, waits up to 250 ms, renews while it runs.
/// #[distributed_lock(key = "job:<job.id>", wait = "250ms", backend = "jobs")]
/// async fn run(job: &Job) -> Result<u64, JobError> {
///     let token = distlock::fencing_token().expect("inside the lock");
///     distlock::checkpoint()?; // inserted between statements anyway; explicit in loops
///     Ok(token)
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), JobError> {
/// Registry::global().register("jobs", Backend::in_process())?;
/// let first = run(&Job { id: 1 }).await?;
/// let second = run(&Job { id: 1 }).await?;
/// assert!(second > first, "fencing tokens increase");
/// # Ok(())
/// # }
/// ```
pub use distlock_macros::distributed_lock;

// The README's examples are compiled (and run) as doc tests too; the README is the crates.io page.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeDoctests;
