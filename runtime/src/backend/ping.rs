//! [`Backend::ping`] and [`BackendBuilder::connect`]: is the backend usable, now — for readiness
//! probes and for failing at start-up instead of at the first request.

use super::builder::BackendBuilder;
use super::handle::Backend;
use crate::engines::engine::{Acquired, Asker, GrantedAs, Ownership};
use crate::error::LockError;
use crate::error::Operation;
use crate::lock::kind::LockKind;
use crate::lock::owner::Owner;
use crate::operating::doctor::Check;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The probe lock's lease: long enough to be released by the probe itself, short enough that a
/// probe cut off midway leaves nothing for long.
const PROBE_LEASE: Duration = Duration::from_secs(2);

impl Backend {
    /// Checks that locks can be taken on this backend now: opens the connections (checking the
    /// credentials, the certificates, the database), takes and releases a probe lock through the
    /// lock scripts (loading them, and exercising the key pattern and the commands a grant and a
    /// release run), subscribes to its release channel as a waiter would, and, where the server
    /// lets its user ask (`ACL DRYRUN`), checks every right locks need (the doctor's `acl`
    /// check; a user that may not ask is found out once, and not asked again). On Redlock, a quorum of masters must answer, as for
    /// a lock; with [`min_replicas`](crate::BackendBuilder::min_replicas), the replicas must
    /// acknowledge the probe.
    ///
    /// The probe's key is `<prefix>:{__distlock_ping:<random>}`, one per backend (after a
    /// release it leaves one token marker, for [`marker_ttl`](crate::BackendBuilder::marker_ttl));
    /// concurrent pings of a backend take turns. Nothing is counted in [`stats`](Self::stats) or
    /// the metrics. For a readiness endpoint:
    ///
    /// ```
    /// # async fn ready(backend: distlock::Backend) -> (u16, String) {
    /// match backend.ping().await {
    ///     Ok(()) => (200, "ready".into()),
    ///     Err(err) => (503, err.to_string()),
    /// }
    /// # }
    /// ```
    ///
    /// # Errors
    /// The error a lock would meet, with its advice: [`LockError::Backend`] for a server that is
    /// unreachable, refuses the credentials, denies a right (naming the rules to grant), or
    /// answers what distlock did not write; [`LockError::ReplicasNotAcknowledged`] when too few
    /// replicas acknowledge; [`LockError::ShutDown`] once the backend was shut down (a readiness
    /// probe then says "not ready").
    ///
    /// # Cancel safety
    /// This method is cancel safe. Dropped at any point, it leaves at most its probe lock held,
    /// which expires within 2 s (a ping meanwhile passes over it), and no lock of the
    /// application is touched.
    pub async fn ping(&self) -> Result<(), LockError> {
        self.refuse_when_closing()?;
        let probe = self.inner.ping_probe.lock().await;
        self.probe_lock(&probe).await?;
        // Release notifications: the subscription a waiter makes (a user without the release
        // channels fails here, as a waiter would).
        let watch = self.inner.engine.watch(&probe).await;
        drop(watch.map_err(|failure| self.backend_error(Operation::Ping, failure))?);
        // The rights the probe does not use (queues, readers, publishing), where the user may
        // ask; a user that may not is not asked again (each refusal is an ACL LOG entry).
        if self.inner.rights_unchecked.load(Ordering::Relaxed) {
            return Ok(());
        }
        let findings = self.inner.engine.rights().await;
        if findings
            .iter()
            .any(|finding| finding.check == Check::Unchecked)
        {
            self.inner.rights_unchecked.store(true, Ordering::Relaxed);
        }
        match findings
            .into_iter()
            .find(|finding| finding.check == Check::Acl)
        {
            Some(denied) => Err(self.failure(Operation::Ping, false, denied.advice)),
            None => Ok(()),
        }
    }

    /// Takes and releases `probe`, as a single try with a fixed lease.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Dropped between the two, the probe lock expires within `PROBE_LEASE`; the next ping passes
    /// over it.
    async fn probe_lock(&self, probe: &str) -> Result<(), LockError> {
        let engine = &self.inner.engine;
        let owner = Owner::random();
        let exclusive = LockKind::Exclusive;
        let acquired = engine
            .acquire(probe, &owner, PROBE_LEASE, Asker::Once, exclusive)
            .await;
        let granted =
            match acquired.map_err(|failure| self.backend_error(Operation::Ping, failure))? {
                Acquired::Yes { fence } => GrantedAs::Quietly { fence },
                Acquired::Unreplicated {
                    acknowledged,
                    wanted,
                    timeout,
                } => {
                    return Err(LockError::ReplicasNotAcknowledged {
                        key: probe.to_owned(),
                        acknowledged,
                        wanted,
                        timeout,
                    })
                }
                // The probe of a ping dropped midway, still held (for at most PROBE_LEASE): the
                // server answered the lock script, which is what this step checks.
                Acquired::Busy { .. } => return Ok(()),
            };
        match engine.release(probe, &owner, exclusive, granted).await {
            Ok(Ownership::Ours) => Ok(()),
            Ok(found) => Err(self.failure(
                Operation::Ping,
                false,
                format!("the probe lock was not ours at release: {found:?}"),
            )),
            Err(failure) => Err(self.backend_error(Operation::Ping, failure)),
        }
    }
}

impl BackendBuilder {
    /// [`build`](Self::build), then [`ping`](Backend::ping): a backend whose connections are open
    /// and whose server accepts locks, or the error that says why not — at start-up, not at the
    /// first request.
    ///
    /// # Errors
    /// - [`LockError::InvalidConfig`] for a setting [`build`](Self::build) refuses.
    /// - [`LockError::Backend`] and [`LockError::ReplicasNotAcknowledged`] as [`Backend::ping`]
    ///   returns them: the server is unreachable, refuses the credentials or a right locks need, or
    ///   too few replicas acknowledge the probe.
    ///
    /// # Cancel safety
    /// This method is cancel safe, as [`Backend::ping`]. Dropped at any point, it leaves at most
    /// a probe lock, which expires within 2 s.
    pub async fn connect(self) -> Result<Backend, LockError> {
        let backend = self.build()?;
        backend.ping().await?;
        Ok(backend)
    }
}
