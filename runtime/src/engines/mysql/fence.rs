//! The fenced write inside the application's own transaction: [`fence`] and [`fence_guard`]
//! make the transaction they run in commit only while its locks are still held by this holder.
//!
//! Each lock's lease row is read in the transaction, by its key and token, still
//! unexpired on the database's clock (`UTC_TIMESTAMP(6)`), and locked `LOCK IN SHARE MODE`
//! until the transaction ends. The row cannot be deleted meanwhile, and a lock changes hands
//! only by deleting the holder's row (a join deletes an expired row first, and waits for a
//! transaction that has it locked — each call up to the response timeout, rounded up to whole
//! seconds, then again until its wait budget is spent; an operator's force-unlock waits
//! likewise), so: either the rows are there and nobody can be granted these locks until the
//! transaction commits or rolls back — the writes commit under the lock — or a row is gone and
//! the call fails, so the transaction never commits a write of a holder whose lock is gone.
//!
//! The read takes `expires_at`, which no secondary index holds, so the lock is on the row itself
//! (InnoDB's clustered record), which every deletion must lock too; a read that an index covers
//! would lock only the index's entry.
//!
//! InnoDB's shared row lock holds back updates of the row too: while the transaction is open,
//! the holder's own renewals wait for it (each up to a second, then counted as failed and
//! asked again). Keep a fenced transaction well under the lease.

use super::sql::hex;
use crate::engines::engine::Deployment;
use crate::engines::sql::fenced::{call_leases, Fenced};
use crate::error::{BackendError, LockError, Operation};
use crate::lock::guard::LockGuard;
use crate::lock::lease::HeldLease;
use crate::Backend;
use sqlx::{AssertSqlSafe, MySqlConnection, Row};
use std::sync::Arc;

/// Makes the transaction on `connection` commit only while every lock of the locked call it
/// runs in (an annotated function, or [`Lock::run`](crate::Lock::run)) is still held, on a
/// MySQL backend: see [the module](crate::mysql). Call it in the transaction before the writes
/// it protects, and commit before the call returns (the lock's release waits for the
/// transaction to end).
///
/// # Errors
/// - [`LockError::NoContext`] outside a locked call.
/// - [`LockError::Lost`] for the first lock whose lease is gone, locally (its validity ran out)
///   or in the database (its row expired, or another holder has the lock): roll the
///   transaction back.
/// - [`LockError::InvalidConfig`] when the call's locks are not on a MySQL backend.
/// - [`LockError::Backend`] (operation [`Operation::FencedWrite`]) when the statement failed on
///   `connection`.
///
/// # Cancel safety
/// Cancel safe for the lock; the transaction is the caller's. Dropped, the statement may or may
/// not have run in the transaction — roll it back, as after any error in it.
pub async fn fence(connection: &mut MySqlConnection) -> Result<(), LockError> {
    let (backend, leases) = call_leases(Deployment::Mysql)?;
    fence_leases(&backend, &leases, connection).await
}

/// [`fence`] for the locks of `guard` (taken with [`Lock::acquire`](crate::Lock::acquire)).
///
/// # Errors
/// As [`fence`], without [`LockError::NoContext`].
///
/// # Cancel safety
/// As [`fence`].
pub async fn fence_guard(
    guard: &LockGuard,
    connection: &mut MySqlConnection,
) -> Result<(), LockError> {
    let leases: Vec<Arc<HeldLease>> = guard.leases().cloned().collect();
    fence_leases(guard.backend(), &leases, connection).await
}

async fn fence_leases(
    backend: &Backend,
    leases: &[Arc<HeldLease>],
    connection: &mut MySqlConnection,
) -> Result<(), LockError> {
    let fenced = Fenced::of(backend, leases, Deployment::Mysql, "MySQL")?;
    if fenced.names.is_empty() {
        return Ok(());
    }
    // Each entry by its key and token (the table's primary key, which AUTO_INCREMENT never
    // hands out twice), written in as literals: no owner, a secret, reaches the statement, which
    // the application's connection may log. Text, not a prepared statement: sqlx's MySQL
    // connection stays usable when a text statement is dropped midway, and the application can
    // roll back.
    let entries: Vec<String> = fenced
        .names
        .iter()
        .zip(&fenced.tokens)
        .map(|(name, token)| format!("({}, {token})", hex(name.as_bytes())))
        .collect();
    let statement = format!(
        "SELECT lock_key FROM {}.entries WHERE (lock_key, token) IN ({}) \
         AND expires_at > UTC_TIMESTAMP(6) LOCK IN SHARE MODE",
        fenced.schema,
        entries.join(", ")
    );
    let query = sqlx::raw_sql(AssertSqlSafe(statement));
    let rows = query.fetch_all(&mut *connection).await.map_err(|err| {
        LockError::Backend(BackendError::new(
            backend.name(),
            Operation::FencedWrite,
            false,
            err,
        ))
    })?;
    let locked: Vec<String> = rows
        .iter()
        .filter_map(|row| row.try_get::<Vec<u8>, _>(0).ok())
        .filter_map(|bytes| String::from_utf8(bytes).ok())
        .collect();
    fenced.all_found(&locked)
}
