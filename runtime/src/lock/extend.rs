//! [`LockGuard::extend`](crate::LockGuard::extend)'s round trip: every key of a fixed lease
//! renewed to what is left of it plus the extension, and the answers applied.

use crate::backend::Backend;
use crate::engines::engine::{Ownership, Renewal};
use crate::error::Operation;
use crate::error::{LockError, LostReason};
use crate::lock::lease::HeldLease;
use crate::lock::policy::valid_for;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Extends `leases` by `by`. A key's new TTL is its local validity left plus `by`: the server's
/// TTL was at least that validity, so the key lives at least `by` past it, and the validity
/// moves to the request's send time plus that TTL less drift — never past the server's TTL.
///
/// # Cancel safety
/// Cancel safe.
/// Dropped after sending, the server may keep the keys longer than the leases' validity, which
/// stays where it was: conservative, never unsafe.
pub(crate) async fn extend<'a>(
    backend: &Backend,
    leases: impl Iterator<Item = &'a Arc<HeldLease>>,
    by: Duration,
) -> Result<(), LockError> {
    let leases: Vec<&Arc<HeldLease>> = leases.collect();
    let now = Instant::now();
    let ttls: Vec<Duration> = leases
        .iter()
        .map(|lease| {
            let left = lease.valid_until().saturating_duration_since(now);
            (left + by).max(Duration::from_millis(1))
        })
        .collect();
    let items: Vec<Renewal<'_>> = leases
        .iter()
        .zip(&ttls)
        .map(|(lease, ttl)| Renewal {
            key: &lease.key,
            owner: &lease.owner,
            ttl: *ttl,
            kind: lease.kind,
        })
        .collect();
    let sent_at = Instant::now();
    let answers = backend
        .inner
        .engine
        .renew(&items)
        .await
        .map_err(|failure| backend.backend_error(Operation::Extend, failure))?;
    let drift = backend.inner.settings.drift_factor;
    let mut unanswered = 0;
    for ((lease, ttl), answer) in leases.iter().zip(&ttls).zip(answers) {
        match answer {
            Some(Ownership::Ours) => lease.extended(sent_at, valid_for(*ttl, drift)),
            Some(Ownership::Gone) => lease.mark_lost(LostReason::Gone),
            Some(Ownership::TakenOver) => lease.mark_lost(LostReason::TakenOver),
            None => unanswered += 1,
        }
    }
    if unanswered > 0 {
        return Err(backend.failure(
            Operation::Extend,
            true,
            format!(
                "{unanswered} of {} keys got no answer to the extension",
                leases.len()
            ),
        ));
    }
    Ok(())
}
