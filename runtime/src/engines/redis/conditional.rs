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
//! waiters). A server without `IFEQ` answers a syntax error: the connection is marked, and every
//! later release on it goes to the script directly. The capability is learned per connection,
//! so a failover to a server of another version learns it again.
//!
//! A conditional write that finds the lock waited on costs a second round trip (the script) on
//! that release, and delays the waiter's wake-up by as much. A key where that happened is
//! [contended](ContendedKeys): its releases go to the script directly for a while.

use crate::owner::Owner;
use redis::Value;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
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

/// Whether a connection's server has `SET … IFEQ`, as learned by using it.
#[derive(Debug, Default)]
pub(crate) struct ConditionalSet(AtomicU8);

const UNKNOWN: u8 = 0;
const SUPPORTED: u8 = 1;
const UNSUPPORTED: u8 = 2;

impl ConditionalSet {
    /// `true` until the server answered that it has no `IFEQ`.
    pub(crate) fn usable(&self) -> bool {
        self.0.load(Ordering::Relaxed) != UNSUPPORTED
    }

    /// Records what a reply said about the server.
    fn learn(&self, outcome: Outcome) {
        match outcome {
            Outcome::Unsupported => self.0.store(UNSUPPORTED, Ordering::Relaxed),
            Outcome::Released | Outcome::NotAsGranted => {
                // Only the first answer changes anything; later ones need no write.
                if self.0.load(Ordering::Relaxed) == UNKNOWN {
                    self.0.store(SUPPORTED, Ordering::Relaxed);
                }
            }
            Outcome::Refused => {}
        }
    }
}

/// What one conditional release found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The key held the granted value: released, the token marker left.
    Released,
    /// The key holds something else now: `release.lua` must find out what.
    NotAsGranted,
    /// The server has no `SET … IFEQ`: `release.lua`, now and from now on.
    Unsupported,
    /// The server refused the command for another reason (out of memory, read-only…):
    /// `release.lua` runs and reports it.
    Refused,
}

/// The value `acquire.lua` wrote for a first-try grant.
pub(crate) fn granted_value(fence: u64, owner: &Owner, label: &[u8]) -> Vec<u8> {
    let mut value = format!("L{fence} {}", owner.as_str()).into_bytes();
    if !label.is_empty() {
        value.push(b' ');
        value.extend_from_slice(label);
    }
    value
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
        .arg(format!("F{fence}"))
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
        Value::ServerError(err)
            if err.code() == "ERR" && err.details().is_some_and(|d| d.contains("syntax")) =>
        {
            Outcome::Unsupported
        }
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
    fn a_syntax_error_marks_the_connection_and_a_nil_does_not() {
        let capability = ConditionalSet::default();
        assert_eq!(outcome(&Value::Nil, &capability), Outcome::NotAsGranted);
        assert!(capability.usable());
        let syntax = redis::parse_redis_value(b"-ERR syntax error\r\n").expect("an error reply");
        assert_eq!(outcome(&syntax, &capability), Outcome::Unsupported);
        assert!(!capability.usable());
    }
}
