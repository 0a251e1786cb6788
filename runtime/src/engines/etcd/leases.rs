//! etcd leases for locks: etcd counts a lease's TTL in whole seconds and grants at least its
//! own minimum (one and a half election timeouts, rounded up: 2 s with etcd's defaults), so a
//! lease of 500 ms is held on the server for longer than asked.
//!
//! A lease is shared: every grant and renewal of the same TTL in the next moments binds its
//! entry to the lease granted last ([`Pool`]), as long as that lease still has the full TTL
//! left — each is asked with up to a second to spare, which is how long it serves. One lease
//! write per second and TTL instead of one per lock; in exchange, a lock nobody renews may
//! outlive its TTL on the server by up to that second (on top of the rounding).
//!
//! The lock's holder still counts its own, shorter validity from the requested TTL: it stops
//! at its checkpoints and reports the lease lost when that ends, while etcd keeps the key a
//! little longer. Nobody else can take the lock before the holder's validity ends — the
//! exclusion a lease promises is kept — but a crashed holder's lock is taken over only when
//! etcd's lease ends. The first lease a backend rounds up is logged once as a warning that
//! says by how much.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// `ttl` in whole seconds, rounded up, at least one.
pub(crate) fn seconds(ttl: Duration) -> i64 {
    let whole = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    whole.max(1) as i64
}

/// The least time a lease is shared for: a lease with less to spare is asked a second longer.
const LEAST_SPARE: Duration = Duration::from_millis(250);

/// What etcd is asked for a lease that grants and renewals of `ttl` share: whole seconds, with
/// at least [`LEAST_SPARE`] to spare.
pub(crate) fn asked(ttl: Duration) -> i64 {
    let rounded = seconds(ttl);
    match Duration::from_secs(rounded as u64) - ttl < LEAST_SPARE {
        true => rounded + 1,
        false => rounded,
    }
}

/// The lease each TTL's grants and renewals bind to now.
#[derive(Default)]
pub(crate) struct Pool {
    leases: Mutex<HashMap<Duration, Shared>>,
}

#[derive(Clone, Copy)]
struct Shared {
    id: i64,
    /// Past this instant the lease has less than the TTL left.
    until: Instant,
}

impl Pool {
    /// A lease with at least `ttl` left from now, if one was granted lately.
    pub(crate) fn take(&self, ttl: Duration) -> Option<i64> {
        let leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        let shared = leases.get(&ttl)?;
        (Instant::now() < shared.until).then_some(shared.id)
    }

    /// etcd granted lease `id` for `granted` seconds, asked at `asked_at`: it serves `ttl`
    /// while it has that much left (counted from the request, before etcd started it).
    pub(crate) fn put(&self, ttl: Duration, id: i64, asked_at: Instant, granted: i64) {
        let lasts = Duration::from_secs(granted.max(0) as u64);
        let until = asked_at + lasts.saturating_sub(ttl);
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        leases.insert(ttl, Shared { id, until });
    }

    /// Lease `id` failed a request (etcd may have lost or revoked it): it is not shared again.
    pub(crate) fn forget(&self, id: i64) {
        let mut leases = self.leases.lock().unwrap_or_else(|e| e.into_inner());
        leases.retain(|_, shared| shared.id != id);
    }
}

/// The lease TTLs a backend has been granted for longer than asked, each warned of once.
#[derive(Default)]
pub(crate) struct Rounding {
    warned: Mutex<HashSet<(Duration, i64)>>,
}

impl Rounding {
    /// etcd granted `granted` seconds for a lease of `asked`: a warning the first time, when
    /// etcd's whole seconds or its minimum made it longer than the second of sharing does.
    pub(crate) fn granted(&self, asked: Duration, granted: i64) {
        let held = Duration::from_secs(granted.max(0) as u64);
        let whole = Duration::from_secs(seconds(asked) as u64) == asked;
        if whole && granted <= self::asked(asked) {
            return;
        }
        let first = self
            .warned
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert((asked, granted));
        if first {
            tracing::warn!(
                target: "distlock::config",
                asked = %humantime::format_duration(asked),
                held_on_server = %humantime::format_duration(held),
                "etcd holds leases in whole seconds, at least its minimum: a lease of {} is \
                 held on the server for up to {}. The holder still counts its validity from the \
                 lease it asked for, so exclusion is kept; a crashed holder's lock frees \
                 only when etcd's lease ends",
                humantime::format_duration(asked),
                humantime::format_duration(held),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_round_up_to_whole_seconds() {
        assert_eq!(seconds(Duration::from_millis(1)), 1);
        assert_eq!(seconds(Duration::from_millis(500)), 1);
        assert_eq!(seconds(Duration::from_secs(1)), 1);
        assert_eq!(seconds(Duration::from_millis(1001)), 2);
        assert_eq!(seconds(Duration::from_secs(30)), 30);
        assert_eq!(asked(Duration::from_millis(300)), 1);
        assert_eq!(asked(Duration::from_millis(800)), 2);
        assert_eq!(asked(Duration::from_secs(30)), 31);
    }

    #[test]
    fn a_shared_lease_serves_while_it_has_the_ttl_left() {
        let pool = Pool::default();
        let ttl = Duration::from_millis(300);
        assert_eq!(pool.take(ttl), None);
        pool.put(ttl, 7, Instant::now(), 1);
        assert_eq!(pool.take(ttl), Some(7));
        assert_eq!(pool.take(Duration::from_secs(30)), None, "another TTL");
        pool.put(ttl, 8, Instant::now() - Duration::from_millis(700), 1);
        assert_eq!(pool.take(ttl), None, "less than the TTL left");
        pool.put(ttl, 9, Instant::now(), 1);
        pool.forget(9);
        assert_eq!(pool.take(ttl), None);
    }
}
