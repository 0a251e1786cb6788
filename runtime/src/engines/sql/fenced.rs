//! What the fenced writes of the database stores share: which locks a call holds on a
//! database of one kind, and what a fence that found some of them gone answers.

use crate::engines::engine::Deployment;
use crate::error::{LockError, LostReason};
use crate::lock::context;
use crate::lock::key::lock_name;
use crate::lock::lease::HeldLease;
use crate::Backend;
use std::sync::Arc;

/// The locks a fence checks, on one backend: their leases, names and tokens.
pub(crate) struct Fenced<'a> {
    pub(crate) schema: &'a str,
    pub(crate) leases: &'a [Arc<HeldLease>],
    pub(crate) names: Vec<String>,
    pub(crate) tokens: Vec<i64>,
}

/// The locks of the locked call this runs in and of the calls around it (a nested call on a
/// key held already holds it through the outer one), on the first `deployment` backend among
/// them (else the call's own backend, which [`Fenced::of`] refuses).
///
/// # Errors
/// [`LockError::NoContext`] outside a locked call.
pub(crate) fn call_leases(
    deployment: Deployment,
) -> Result<(Backend, Vec<Arc<HeldLease>>), LockError> {
    let frame = context::current().ok_or(LockError::NoContext)?;
    let held: Vec<(&Backend, &Arc<HeldLease>)> = frame.held().collect();
    let backend = held
        .iter()
        .map(|(backend, _)| *backend)
        .find(|backend| backend.deployment() == deployment)
        .unwrap_or(&frame.backend);
    let leases = held
        .iter()
        .filter(|(on, _)| on.same_as(backend))
        .map(|(_, lease)| Arc::clone(lease))
        .collect();
    Ok((backend.clone(), leases))
}

impl<'a> Fenced<'a> {
    /// The locks `leases` of `backend`, which must keep them in a `deployment` database
    /// (`database` names it for the error), each still valid on this process's clock.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for a backend of another kind; [`LockError::Lost`] for a
    /// lease whose validity ran out.
    pub(crate) fn of(
        backend: &'a Backend,
        leases: &'a [Arc<HeldLease>],
        deployment: Deployment,
        database: &str,
    ) -> Result<Fenced<'a>, LockError> {
        let schema = match backend.inner.engine.sql_schema() {
            Some(schema) if backend.deployment() == deployment => schema,
            _ => {
                return Err(LockError::invalid_config(
                    "backend",
                    format!(
                        "`{}` keeps its locks in {}, not in {database}: a fenced write in a \
                         {database} transaction needs the lock in the same database \
                         (Backend::{deployment})",
                        backend.name(),
                        backend.deployment()
                    ),
                ))
            }
        };
        for lease in leases {
            lease.check()?;
        }
        let prefix = &backend.inner.settings.prefix;
        Ok(Fenced {
            schema,
            leases,
            names: leases
                .iter()
                .map(|lease| lock_name(prefix, &lease.key))
                .collect(),
            tokens: leases.iter().map(|lease| lease.fence as i64).collect(),
        })
    }

    /// `Ok` when the fence found and locked every lock (`locked`: the names it found);
    /// [`LockError::Lost`] for the first one it did not.
    pub(crate) fn all_found(&self, locked: &[String]) -> Result<(), LockError> {
        match self.names.iter().position(|name| !locked.contains(name)) {
            None => Ok(()),
            Some(missing) => Err(LockError::Lost {
                key: self.leases[missing].key.clone(),
                reason: LostReason::Gone,
            }),
        }
    }
}
