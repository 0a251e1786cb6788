//! Releasing with one conditional write instead of a script, where the server has one.
//!
//! A lock granted on its caller's first try holds exactly the value `acquire.lua` wrote,
//! `L<token> <owner>[ <label>]`, until someone is told it is busy (the value turns `W…`) or it
//! ends. Releasing such a lock is what `release.lua` does for state `L`: the value becomes the
//! token marker `F<token>` for the marker TTL, nobody is notified. Servers with conditional `SET`
//! (Valkey ≥ 8.1, Redis ≥ 8.4) do that in one command, without Lua:
//!
//! ```text
//! SET <lock> F<token> IFEQ "L<token> <owner>[ <label>]" PX <marker ttl>
//! ```
//!
//! `OK` means released. A nil reply means the key no longer holds the granted value — waited on,
//! expired, taken over — and the caller runs `release.lua`, which tells which (and notifies the
//! waiters). A server without `IFEQ` answers an error (`ERR syntax error`): the connection is
//! marked, and its releases go to the script directly for [`RETRY_AFTER`], after which one
//! conditional write asks again — a server upgraded behind the same address, or a cluster whose
//! rolling upgrade finished, is found out within that time. The capability is kept per
//! connection, so a Sentinel failover (a new connection) learns it again at once.
//!
//! A conditional write that finds the lock waited on costs a second round trip (the script) on
//! that release, and delays the waiter's wake-up by as much. A key where that happened is
//! [contended](ContendedKeys): its releases go to the script directly for a while.

use crate::engines::redis::protocol::{LockValue, State};
use crate::lock::lease::{from_nanos, to_nanos};
use crate::lock::owner::Owner;
use redis::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a key whose conditional release found it waited on is released by script only.
const CONTENDED_FOR: Duration = Duration::from_secs(1);

/// Keys remembered as contended at most; past it, the expired ones are forgotten (and all of
/// them if none had expired: the memory is an optimisation, never a correctness matter).
const CONTENDED_KEYS_MAX: usize = 4096;

/// Keys whose conditional release recently found them waited on (or expired, or taken over):
/// their next releases skip the conditional write, which would miss again.
#[derive(Debug, Default)]
pub(crate) struct ContendedKeys(Mutex<HashMap<String, Instant>>);

impl ContendedKeys {
    /// `true` while `lock` is remembered as contended.
    pub(crate) fn contains(&self, lock: &str) -> bool {
        let keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        keys.get(lock).is_some_and(|until| Instant::now() < *until)
    }

    /// Remembers `lock` as contended for [`CONTENDED_FOR`].
    pub(crate) fn note(&self, lock: &str) {
        let now = Instant::now();
        let mut keys = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if keys.len() >= CONTENDED_KEYS_MAX {
            keys.retain(|_, until| now < *until);
            if keys.len() >= CONTENDED_KEYS_MAX {
                keys.clear();
            }
        }
        keys.insert(lock.to_owned(), now + CONTENDED_FOR);
    }
}

/// How long a connection whose server refused `SET … IFEQ` releases by script only before
/// asking again.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(60);

/// Whether a connection's server has `SET … IFEQ`, as learned by using it: usable until a server
/// refuses it, then not for [`RETRY_AFTER`].
#[derive(Debug, Default)]
pub(crate) struct ConditionalSet {
    /// When the conditional write may be tried again ([`to_nanos`]); 0 while it is usable.
    refused_until: AtomicU64,
}

impl ConditionalSet {
    /// `true` unless the server refused the conditional write less than [`RETRY_AFTER`] ago.
    pub(crate) fn usable(&self) -> bool {
        match self.refused_until.load(Ordering::Relaxed) {
            0 => true,
            until => Instant::now() >= from_nanos(until),
        }
    }

    /// Records what a reply said about the server.
    fn learn(&self, outcome: Outcome) {
        let until = match outcome {
            Outcome::Unsupported => to_nanos(Instant::now() + RETRY_AFTER).max(1),
            Outcome::Released | Outcome::NotAsGranted => 0,
            Outcome::Refused => return,
        };
        self.refused_until.store(until, Ordering::Relaxed);
    }
}

/// What one conditional release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The key held the granted value: released, the token marker left.
    Released,
    /// The key holds something else now: `release.lua` must find out what.
    NotAsGranted,
    /// The server has no `SET … IFEQ` (it answered `ERR …`: a syntax error, an unknown option):
    /// `release.lua`, now and for [`RETRY_AFTER`].
    Unsupported,
    /// The server refused the command for a reason of the moment (out of memory, read-only, a
    /// slot moving, loading…): `release.lua` runs and reports it.
    Refused,
}

/// The value `acquire.lua` wrote for a first-try grant.
pub(crate) fn granted_value(fence: u64, owner: &Owner, label: &[u8]) -> Vec<u8> {
    LockValue::held(State::Held, fence, owner.as_str(), label)
}

/// `SET <lock> F<fence> IFEQ <granted value> PX <marker ttl>`.
pub(crate) fn release_command(
    lock: &str,
    fence: u64,
    owner: &Owner,
    label: &[u8],
    marker_ttl: Duration,
) -> redis::Cmd {
    let mut cmd = redis::cmd("SET");
    cmd.arg(lock)
        .arg(LockValue::free(fence))
        .arg("IFEQ")
        .arg(granted_value(fence, owner, label))
        .arg("PX")
        .arg(marker_ttl.as_millis().max(1) as u64);
    cmd
}

/// Reads one reply of [`release_command`] (sent in a pipeline that keeps errors as values), and
/// records on `capability` what it says about the server.
pub(crate) fn outcome(reply: &Value, capability: &ConditionalSet) -> Outcome {
    let outcome = match reply {
        Value::Okay => Outcome::Released,
        Value::SimpleString(text) if text == "OK" => Outcome::Released,
        Value::Nil => Outcome::NotAsGranted,
        Value::ServerError(err) if err.code() == "ERR" => Outcome::Unsupported,
        _ => Outcome::Refused,
    };
    capability.learn(outcome);
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_granted_value_is_what_acquire_lua_writes() {
        let owner = Owner::from_raw("0123abcd");
        assert_eq!(
            granted_value(1796300000123456, &owner, b"web-3:4242"),
            b"L1796300000123456 0123abcd web-3:4242"
        );
        assert_eq!(granted_value(7, &owner, b""), b"L7 0123abcd");
    }

    #[test]
    fn a_contended_key_is_remembered_and_the_memory_stays_bounded() {
        let keys = ContendedKeys::default();
        assert!(!keys.contains("a"));
        keys.note("a");
        assert!(keys.contains("a"));
        for i in 0..CONTENDED_KEYS_MAX + 10 {
            keys.note(&i.to_string());
        }
        assert!(keys.0.lock().unwrap().len() <= CONTENDED_KEYS_MAX);
    }

    #[test]
    fn an_err_reply_marks_the_connection_for_a_while_and_a_nil_does_not() {
        let capability = ConditionalSet::default();
        assert_eq!(outcome(&Value::Nil, &capability), Outcome::NotAsGranted);
        assert!(capability.usable());
        let oom = redis::parse_redis_value(b"-OOM command not allowed\r\n").unwrap();
        assert_eq!(outcome(&oom, &capability), Outcome::Refused);
        assert!(
            capability.usable(),
            "a refusal of the moment says nothing of IFEQ"
        );
        let syntax = redis::parse_redis_value(b"-ERR syntax error\r\n").expect("an error reply");
        assert_eq!(outcome(&syntax, &capability), Outcome::Unsupported);
        assert!(!capability.usable());
        // Past RETRY_AFTER it is tried again.
        capability
            .refused_until
            .store(to_nanos(Instant::now()).max(1), Ordering::Relaxed);
        assert!(capability.usable());
        assert_eq!(outcome(&Value::Okay, &capability), Outcome::Released);
        assert_eq!(capability.refused_until.load(Ordering::Relaxed), 0);
    }
}
