//! What operators ask of a backend, beyond [`Backend::inspect`] and [`Backend::doctor`]: every
//! held lock ([`Backend::list`]), removing a stuck one ([`Backend::force_unlock`]), and following
//! one live ([`Backend::events`]). The `distlock` CLI is a thin shell around these.

use crate::backend::Backend;
use crate::engines::engine::Holder;
use crate::error::LockError;
use crate::error::Operation;
use crate::operating::key_events::{KeyEvent, KeyEvents, Notifications};
use futures_util::stream::{self, StreamExt};
use std::collections::HashSet;

/// Locks inspected at once by [`Backend::list`].
const LIST_CONCURRENCY: usize = 32;

/// A lock [`Backend::list`] found held.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The lock's key, as it was given to the lock (without the prefix).
    pub key: String,
    /// Who holds it.
    pub holder: Holder,
}

/// What happened to a lock, as [`LockEvents`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEventKind {
    /// A new holder took it.
    Acquired,
    /// Its holder renewed it (or retried its acquire).
    Renewed,
    /// Its holder released it.
    Released,
    /// Its TTL ran out before anyone released it: a holder died, stalled or was cut off.
    Expired,
    /// The server evicted the key under memory pressure: the lock vanished while held (see
    /// `distlock doctor`).
    Evicted,
    /// Someone deleted the key by hand.
    Deleted,
    /// A caller was told it is busy and waits for the release.
    WaitedOn,
    /// The key was rewritten with the same holder (Redlock recording a token).
    Updated,
    /// The subscription on a server was lost; events may be missed until it is back.
    Interrupted {
        /// Why.
        reason: String,
    },
    /// The subscription is back; events in between were missed.
    Resubscribed,
    /// A notification this version does not interpret (its Redis event name).
    Other(String),
}

/// One event of a lock: what happened on which server, and the lock's state read right after
/// (on Redlock, as a quorum of masters sees it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockEvent {
    /// What happened.
    pub kind: LockEventKind,
    /// The server it happened on (`host:port`).
    pub server: String,
    /// Who holds the lock right after; the state is read after the notification arrives, so
    /// under quick succession it may already show a later change.
    pub holder: Option<Holder>,
}

/// The live events of one lock, from [`Backend::events`]. Following stops when this is dropped.
pub struct LockEvents {
    backend: Backend,
    key: String,
    raw: KeyEvents,
    last_owner: Option<String>,
    /// Servers whose last notification was a `set` with a TTL: Redis announces `SET … PX` as
    /// `set` then `expire`, and that `expire` is part of the write, not a renewal.
    set_with_ttl: HashSet<String>,
}

impl std::fmt::Debug for LockEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockEvents")
            .field("key", &self.key)
            .finish()
    }
}

impl LockEvents {
    /// The next event; `None` when the backend stopped following (it was dropped).
    ///
    /// # Errors
    /// [`LockError::Backend`], as `Some(Err(_))`, when the lock's state could not be read after
    /// a notification: that event is lost, and following goes on (the next call waits for the
    /// next notification).
    ///
    /// # Cancel safety
    /// Not cancel safe once a notification has arrived: dropped while it reads the lock's state,
    /// that event is lost (the events after it are not). Dropped while it waits for a
    /// notification, it loses nothing.
    pub async fn next(&mut self) -> Option<Result<LockEvent, LockError>> {
        let (server, event) = loop {
            match self.raw.next().await? {
                KeyEvent::Notified { server, event } if event == "expire" => {
                    if !self.set_with_ttl.remove(&server) {
                        break (server, event);
                    }
                }
                KeyEvent::Notified { server, event } => {
                    // Every lock write carries a TTL but Redlock's token record (`KEEPTTL`).
                    if event == "set" {
                        self.set_with_ttl.insert(server.clone());
                    } else {
                        self.set_with_ttl.remove(&server);
                    }
                    break (server, event);
                }
                KeyEvent::Interrupted { server, reason } => {
                    return Some(Ok(LockEvent {
                        kind: LockEventKind::Interrupted { reason },
                        server,
                        holder: None,
                    }))
                }
                KeyEvent::Resubscribed { server } => break (server, String::new()),
            }
        };
        let holder = match self.backend.inspect(&self.key).await {
            Ok(holder) => holder,
            Err(err) => return Some(Err(err)),
        };
        let owner = holder.as_ref().map(|holder| holder.owner.clone());
        let changed_hands = owner.is_some() && owner != self.last_owner;
        let kind = match event.as_str() {
            "" => LockEventKind::Resubscribed,
            "set" if changed_hands => LockEventKind::Acquired,
            "set" if owner.is_none() => LockEventKind::Released,
            "set" => LockEventKind::Updated,
            "expire" => LockEventKind::Renewed,
            "expired" => LockEventKind::Expired,
            "evicted" => LockEventKind::Evicted,
            "del" => LockEventKind::Deleted,
            "setrange" => LockEventKind::WaitedOn,
            other => LockEventKind::Other(other.to_owned()),
        };
        self.last_owner = owner;
        Some(Ok(LockEvent {
            kind,
            server,
            holder,
        }))
    }
}

impl Backend {
    /// Every lock held under this backend's prefix whose key matches `pattern` (a Redis glob:
    /// `*`, `?`, `[a-z]`, `\` escapes), soonest to expire first. Redis servers are walked with
    /// `SCAN` (never `KEYS`), every master of a cluster and of Redlock, and each lock found is
    /// inspected; a lock taken or released during the walk may be missed or shown.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), distlock::LockError> {
    /// let backend = distlock::Backend::in_process();
    /// let _guard = distlock::Lock::new("order:17").on(&backend).acquire().await?;
    /// let held = backend.list("order:*").await?;
    /// assert_eq!(held[0].key, "order:17");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] when a server could not be walked or a lock found could not be
    /// inspected (unreachable, no answer in time, a command refused); no partial list is
    /// returned.
    ///
    /// # Cancel safety
    /// This method is cancel safe. It only reads: dropping the future changes nothing.
    pub async fn list(&self, pattern: &str) -> Result<Vec<HeldLock>, LockError> {
        let keys = self
            .inner
            .engine
            .list(pattern)
            .await
            .map_err(|failure| self.backend_error(Operation::List, failure))?;
        let inspected: Vec<Result<Option<HeldLock>, LockError>> = stream::iter(keys)
            .map(|key| async move {
                let holder = self
                    .inner
                    .engine
                    .inspect(&key)
                    .await
                    .map_err(|failure| self.backend_error(Operation::List, failure))?;
                Ok(holder.map(|holder| HeldLock { key, holder }))
            })
            .buffer_unordered(LIST_CONCURRENCY)
            .collect()
            .await;
        let mut held = Vec::new();
        for lock in inspected {
            held.extend(lock?);
        }
        held.sort_by(|a, b| a.holder.ttl.cmp(&b.holder.ttl).then(a.key.cmp(&b.key)));
        Ok(held)
    }

    /// Removes `key`'s lock whoever holds it — for a stuck lock an operator has decided to break
    /// (`distlock unlock --force`). Returns the holder it removed (`None`: it was free). Waiters
    /// are woken; the next token is larger than the removed holder's, so the next holder's
    /// fenced writes make the resource reject the removed holder's late ones; the removed
    /// holder's watchdog finds the lock gone at its next renewal and reports the lease lost.
    ///
    /// Nothing stops the removed holder's unfenced side effects: break a lock only when its
    /// holder is known to be dead or stuck.
    ///
    /// # Errors
    /// - [`LockError::InvalidKey`] for a key no lock can have: empty, longer than
    ///   [`max_key_len`](crate::BackendBuilder::max_key_len), or holding `{`, `}` or a control
    ///   character.
    /// - [`LockError::Backend`] when the server did not answer or refused the command; when the
    ///   error [is ambiguous](crate::BackendError::is_ambiguous), the lock may have been removed.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after its request was sent, the lock may have been removed all
    /// the same, and the holder it removed is not reported.
    pub async fn force_unlock(&self, key: &str) -> Result<Option<Holder>, LockError> {
        crate::lock::key::validate(key, self.inner.settings.max_key_len)?;
        self.inner
            .engine
            .force_unlock(key)
            .await
            .map_err(|failure| self.backend_error(Operation::Unlock, failure))
    }

    /// Follows `key` live: every acquire, renewal, release, expiry and eviction, from the
    /// server's keyspace notifications (`notify-keyspace-events`; off by default: `Require`
    /// fails naming the flags to add, `Enable` adds them). Resolves once the subscription is in
    /// force, so nothing after it is missed; a lost connection is reported and restored
    /// (Sentinel: on the new primary; Cluster: on the slot's owner). Not on the in-process
    /// backend.
    ///
    /// # Errors
    /// - [`LockError::InvalidKey`] for a key no lock can have: empty, longer than
    ///   [`max_key_len`](crate::BackendBuilder::max_key_len), or holding `{`, `}` or a control
    ///   character.
    /// - [`LockError::Backend`] on the in-process backend, which has no events to follow; with
    ///   [`Notifications::Require`], when a Redis server does not send the notifications (the error
    ///   names the flags to add); when a server refuses `CONFIG` or the subscription; when it
    ///   cannot be reached (on Redlock, an unreachable master is reported as an
    ///   [`Interrupted`](LockEventKind::Interrupted) event instead); and when the lock's holder
    ///   cannot be read once subscribed.
    ///
    /// # Cancel safety
    /// This method is cancel safe. Dropped before it resolves, it leaves no subscription
    /// behind; with [`Notifications::Enable`], a `CONFIG SET` already sent may still turn the
    /// notifications on, as asked.
    pub async fn events(
        &self,
        key: &str,
        notifications: Notifications,
    ) -> Result<LockEvents, LockError> {
        crate::lock::key::validate(key, self.inner.settings.max_key_len)?;
        let (sender, raw) = KeyEvents::channel();
        self.inner
            .engine
            .follow(key, notifications, sender)
            .await
            .map_err(|failure| self.backend_error(Operation::Events, failure))?;
        let last_owner = self.inspect(key).await?.map(|holder| holder.owner);
        Ok(LockEvents {
            backend: self.clone(),
            key: key.to_owned(),
            raw,
            last_owner,
            set_with_ttl: HashSet::new(),
        })
    }
}
