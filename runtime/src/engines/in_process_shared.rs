//! The in-process backend's shared locks: readers and semaphore permits, each holder with its
//! own lease — the semantics of `shared_acquire.lua` for one process.

use crate::engine::{Acquired, EngineFailure, EngineResult, Holder, Ownership};
use crate::kind::{LockKind, WRITER_INTENT};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What [`Shared::enter`] found.
pub(crate) enum Entered {
    /// A new holder: it gets a token.
    New,
    /// Already a holder (a retry after a lost reply): the key's latest token, as on Redis.
    Again,
    /// Not admitted.
    Busy(Acquired),
}

/// The holders of one shared key.
pub(crate) struct Shared {
    kind: LockKind,
    /// Owner token → lease expiry.
    holders: HashMap<String, Instant>,
    /// A writer waits: new readers queue behind it until then.
    writer_until: Option<Instant>,
    /// A permit was refused since the last release: someone waits for one.
    full_refused: bool,
}

impl Shared {
    pub(crate) fn new(kind: LockKind) -> Shared {
        Shared {
            kind,
            holders: HashMap::new(),
            writer_until: None,
            full_refused: false,
        }
    }

    /// Drops expired holders; `true` when someone still holds the key.
    pub(crate) fn prune(&mut self, now: Instant) -> bool {
        self.holders.retain(|_, expiry| *expiry > now);
        !self.holders.is_empty()
    }

    /// Worth keeping: someone holds the key, or a waiting writer's intent still reserves it
    /// (the last reader left it to that writer: no new reader may take it first).
    pub(crate) fn is_live(&mut self, now: Instant) -> bool {
        self.prune(now) || self.writer_until.is_some_and(|until| until > now)
    }

    pub(crate) fn is_semaphore(&self) -> bool {
        matches!(self.kind, LockKind::Permits(_))
    }

    /// A writer asks while readers hold: it waits, and new readers queue behind it.
    pub(crate) fn writer_waits(&mut self, now: Instant) -> Acquired {
        self.writer_until = Some(now + WRITER_INTENT);
        Acquired::Busy {
            ttl: self.longest(now),
            reserved: false,
            next: None,
        }
    }

    /// Takes a reader's or permit's place for `owner`, or finds the key full (or a writer
    /// waiting): `Ok(Entered::Busy(..))`. A key whose holders all expired takes any kind, as
    /// the Redis key would have expired.
    pub(crate) fn enter(
        &mut self,
        key: &str,
        kind: LockKind,
        owner: &str,
        ttl: Duration,
        now: Instant,
    ) -> EngineResult<Entered> {
        if !self.prune(now) && self.writer_until.is_none_or(|until| until <= now) {
            *self = Shared::new(kind);
        }
        if self.is_semaphore() != matches!(kind, LockKind::Permits(_)) {
            return Err(EngineFailure::kind_mismatch(key, kind));
        }
        self.kind = kind;
        if self.holders.contains_key(owner) {
            // An idempotent retry: the lease is refreshed.
            self.holders.insert(owner.to_owned(), now + ttl);
            return Ok(Entered::Again);
        }
        {
            if self.writer_until.is_some_and(|until| until > now) {
                return Ok(Entered::Busy(Acquired::Busy {
                    ttl: self.writer_until.map(|until| until - now),
                    reserved: false,
                    next: None,
                }));
            }
            if let LockKind::Permits(permits) = kind {
                if self.holders.len() >= permits as usize {
                    self.full_refused = true;
                    let first = self.holders.values().min().copied();
                    return Ok(Entered::Busy(Acquired::Busy {
                        ttl: first.map(|expiry| expiry - now),
                        reserved: false,
                        next: None,
                    }));
                }
            }
        }
        self.holders.insert(owner.to_owned(), now + ttl);
        Ok(Entered::New)
    }

    /// `owner` leaves; whether it still held its place.
    pub(crate) fn leave(&mut self, owner: &str, now: Instant) -> Ownership {
        self.full_refused = false;
        match self.holders.remove(owner) {
            Some(expiry) if expiry > now => Ownership::Ours,
            _ => Ownership::Gone,
        }
    }

    /// Renews `owner`'s lease.
    pub(crate) fn renew(&mut self, owner: &str, ttl: Duration, now: Instant) -> Ownership {
        match self.holders.get_mut(owner) {
            Some(expiry) if *expiry > now => {
                *expiry = now + ttl;
                Ownership::Ours
            }
            _ => Ownership::Gone,
        }
    }

    /// The longest-living holder's time left.
    fn longest(&self, now: Instant) -> Option<Duration> {
        self.holders.values().max().map(|expiry| *expiry - now)
    }

    /// What inspect shows of a held shared key.
    pub(crate) fn holder(&self, fence: u64, label: Option<String>, now: Instant) -> Holder {
        let waited_on = self.full_refused || self.writer_until.is_some_and(|until| until > now);
        Holder {
            owner: String::new(),
            fencing_token: fence,
            ttl: self.longest(now).unwrap_or_default(),
            label,
            waited_on,
            waiting: Some(u64::from(waited_on)),
            shared: Some(self.holders.len() as u64),
        }
    }
}

/// Shared keys, by key.
pub(crate) type SharedLocks = HashMap<String, Shared>;
