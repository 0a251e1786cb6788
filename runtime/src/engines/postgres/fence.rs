//! The fenced write inside the application's own transaction: [`fence`] and [`fence_guard`]
//! make the transaction they run in commit only while its locks are still held by this holder.
//!
//! Each lock's lease row is read in the transaction, by its key, owner and token, still
//! unexpired on the database's clock, and locked `FOR KEY SHARE` until the transaction ends.
//! The row cannot be deleted meanwhile, and a lock changes hands only by deleting the holder's
//! row (a join deletes an expired row first, and waits for a transaction that has it locked —
//! each call up to the response timeout, then again until its wait budget is spent; an
//! operator's force-unlock waits likewise), so: either the rows are there and nobody can be granted
//! these locks until the transaction commits or rolls back — the writes commit under the lock —
//! or a row is gone and the call fails, so the transaction never commits a write of a holder
//! whose lock is gone. Renewals still pass (they change the row's time, not its key).

use super::sql::Statements;
use crate::engines::engine::Deployment;
use crate::engines::sql::fenced::{call_leases, Fenced};
use crate::error::{BackendError, LockError, Operation};
use crate::lock::guard::LockGuard;
use crate::lock::lease::HeldLease;
use crate::Backend;
use sqlx::{AssertSqlSafe, PgConnection, Row};
use std::sync::Arc;

/// Makes the transaction on `connection` commit only while every lock of the locked call it
/// runs in (an annotated function, or [`Lock::run`](crate::Lock::run)) is still held, on a
/// PostgreSQL backend: see [the module](crate::postgres). Call it in the transaction before
/// the writes it protects, and commit before the call returns (the lock's release waits for
/// the transaction to end).
///
/// # Errors
/// - [`LockError::NoContext`] outside a locked call.
/// - [`LockError::Lost`] for the first lock whose lease is gone, locally (its validity ran out)
///   or in the database (its row expired, or another holder has the lock): roll the
///   transaction back.
/// - [`LockError::InvalidConfig`] when the call's locks are not on a PostgreSQL backend.
/// - [`LockError::Backend`] (operation [`Operation::FencedWrite`]) when the statement failed on
///   `connection`.
///
/// # Cancel safety
/// Cancel safe for the lock; the transaction is the caller's. Dropped, the statement may or may
/// not have run in the transaction — roll it back, as after any error in it.
pub async fn fence(connection: &mut PgConnection) -> Result<(), LockError> {
    let (backend, leases) = call_leases(Deployment::Postgres)?;
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
    connection: &mut PgConnection,
) -> Result<(), LockError> {
    let leases: Vec<Arc<HeldLease>> = guard.leases().cloned().collect();
    fence_leases(guard.backend(), &leases, connection).await
}

async fn fence_leases(
    backend: &Backend,
    leases: &[Arc<HeldLease>],
    connection: &mut PgConnection,
) -> Result<(), LockError> {
    let fenced = Fenced::of(backend, leases, Deployment::Postgres, "PostgreSQL")?;
    let statement = Statements::of(fenced.schema).fence;
    let owners: Vec<&str> = leases.iter().map(|lease| lease.owner.as_str()).collect();
    // Bound, not written in: the owners are secrets, and the statement may be logged by the
    // application's connection. Unnamed (not kept prepared), for a transaction-mode pooler.
    let rows = sqlx::query(AssertSqlSafe(statement))
        .bind(&fenced.names)
        .bind(&owners)
        .bind(&fenced.tokens)
        .persistent(false)
        .fetch_all(&mut *connection)
        .await
        .map_err(|err| {
            LockError::Backend(BackendError::new(
                backend.name(),
                Operation::FencedWrite,
                false,
                err,
            ))
        })?;
    let locked: Vec<String> = rows.iter().filter_map(|row| row.try_get(0).ok()).collect();
    fenced.all_found(&locked)
}
