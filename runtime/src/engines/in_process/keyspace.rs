//! The few Redis data types and commands the lock scripts use, in memory: strings and sorted
//! sets with millisecond TTLs, expired lazily where they are met and swept every so often, and
//! the server clock (`TIME`). The in-process engine runs the scripts' transitions
//! (`scripts.rs`) on it, as Redis runs the Lua scripts on its keyspace.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A key's value.
enum Data {
    String(String),
    SortedSet(SortedSet),
}

/// Members ordered by (score, member), as Redis orders them.
#[derive(Default)]
pub(crate) struct SortedSet {
    scores: HashMap<String, i64>,
    order: BTreeSet<(i64, String)>,
}

struct Item {
    data: Data,
    expires_at: Option<Instant>,
}

/// Expired keys are swept every this many commands: memory stays bounded by the keys alive.
const SWEEP_EVERY: usize = 1024;

/// An in-memory keyspace.
#[derive(Default)]
pub(crate) struct Keyspace {
    items: HashMap<String, Item>,
    commands_since_sweep: usize,
    /// The server clock when set (the differential test sets it to the Redis server's).
    #[cfg(distlock_test_hooks)]
    clock_us: Option<u64>,
}

/// The TTL a `SET` leaves: a new one, or the one the key had (`KEEPTTL`).
#[derive(Clone, Copy)]
pub(crate) enum Ttl {
    Px(u64),
    Keep,
}

impl Keyspace {
    /// The server clock in µs since the epoch (`TIME`).
    pub(crate) fn time_us(&self) -> u64 {
        #[cfg(distlock_test_hooks)]
        if let Some(now) = self.clock_us {
            return now;
        }
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_micros() as u64)
    }

    /// Sets the server clock (`TIME`) to `now_us` from now on: TTLs run on it too.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn set_clock(&mut self, now_us: u64) {
        self.clock_us = Some(now_us);
    }

    /// The instant TTLs are measured against: the monotonic clock, or the set server clock
    /// as an instant (so that a test's clock moves TTLs too).
    fn now(&self) -> Instant {
        #[cfg(distlock_test_hooks)]
        if let Some(now) = self.clock_us {
            return clock_epoch() + Duration::from_micros(now);
        }
        Instant::now()
    }

    /// `ZRANGE key 0 -1 WITHSCORES`.
    #[cfg(distlock_test_hooks)]
    pub(crate) fn zrange_all(&mut self, key: &str) -> Vec<(String, i64)> {
        self.zset(key).map_or(Vec::new(), |set| {
            set.order
                .iter()
                .map(|(score, member)| (member.clone(), *score))
                .collect()
        })
    }

    /// The live item at `key`, an expired one removed first.
    fn live(&mut self, key: &str) -> Option<&mut Item> {
        self.commands_since_sweep += 1;
        if self.commands_since_sweep >= SWEEP_EVERY {
            self.commands_since_sweep = 0;
            let now = self.now();
            self.items
                .retain(|_, item| item.expires_at.is_none_or(|at| at > now));
            crate::util::sparse::shrink_when_sparse(&mut self.items);
        }
        let expired = self
            .items
            .get(key)
            .and_then(|item| item.expires_at)
            .is_some_and(|at| at <= self.now());
        if expired {
            self.items.remove(key);
        }
        self.items.get_mut(key)
    }

    /// `GET`: a string's value (`None` for no key, or a key of another type).
    pub(crate) fn get(&mut self, key: &str) -> Option<String> {
        match &self.live(key)?.data {
            Data::String(value) => Some(value.clone()),
            Data::SortedSet(_) => None,
        }
    }

    /// `SET key value PX ms` (or `KEEPTTL`).
    pub(crate) fn set(&mut self, key: &str, value: String, ttl: Ttl) {
        let kept = match ttl {
            Ttl::Keep => self.live(key).and_then(|item| item.expires_at),
            Ttl::Px(ms) => Some(self.now() + Duration::from_millis(ms)),
        };
        self.items.insert(
            key.to_owned(),
            Item {
                data: Data::String(value),
                expires_at: kept,
            },
        );
    }

    /// `SET key value PX ms XX`: only if the key exists; `true` when it was set.
    pub(crate) fn set_existing(&mut self, key: &str, value: String, ms: u64) -> bool {
        if self.live(key).is_none() {
            return false;
        }
        self.set(key, value, Ttl::Px(ms));
        true
    }

    /// `SETRANGE key 0 letter`: a string's first byte replaced (TTL kept).
    pub(crate) fn set_first(&mut self, key: &str, letter: u8) {
        if let Some(Item {
            data: Data::String(value),
            ..
        }) = self.live(key)
        {
            let mut bytes = std::mem::take(value).into_bytes();
            if let Some(first) = bytes.first_mut() {
                *first = letter;
            }
            *value = String::from_utf8(bytes).expect("an ASCII letter for an ASCII letter");
        }
    }

    /// `PEXPIRE key ms`: `true` when the key exists.
    pub(crate) fn pexpire(&mut self, key: &str, ms: u64) -> bool {
        let at = self.now() + Duration::from_millis(ms);
        match self.live(key) {
            Some(item) => {
                item.expires_at = Some(at);
                true
            }
            None => false,
        }
    }

    /// `PTTL key`: the milliseconds left; -2 for no key, -1 for no TTL.
    pub(crate) fn pttl(&mut self, key: &str) -> i64 {
        let now = self.now();
        match self.live(key) {
            None => -2,
            Some(Item {
                expires_at: None, ..
            }) => -1,
            Some(Item {
                expires_at: Some(at),
                ..
            }) => at.saturating_duration_since(now).as_millis() as i64,
        }
    }

    /// `DEL key`: `true` when it existed.
    pub(crate) fn del(&mut self, key: &str) -> bool {
        self.live(key).is_some() && self.items.remove(key).is_some()
    }

    /// `EXISTS key`.
    pub(crate) fn exists(&mut self, key: &str) -> bool {
        self.live(key).is_some()
    }

    /// Every live key matching `keep`.
    pub(crate) fn keys(&mut self, mut keep: impl FnMut(&str) -> bool) -> Vec<String> {
        let now = self.now();
        self.items
            .iter()
            .filter(|(key, item)| item.expires_at.is_none_or(|at| at > now) && keep(key))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// The sorted set at `key`, if there is one (`None` for no key, or a string).
    fn zset(&mut self, key: &str) -> Option<&mut SortedSet> {
        match &mut self.live(key)?.data {
            Data::SortedSet(set) => Some(set),
            Data::String(_) => None,
        }
    }

    /// `ZADD key score member` (a new member, or a new score for it).
    pub(crate) fn zadd(&mut self, key: &str, score: i64, member: &str) {
        if self.zset(key).is_none() {
            self.items.insert(
                key.to_owned(),
                Item {
                    data: Data::SortedSet(SortedSet::default()),
                    expires_at: None,
                },
            );
        }
        let set = self.zset(key).expect("made above");
        if let Some(old) = set.scores.insert(member.to_owned(), score) {
            set.order.remove(&(old, member.to_owned()));
        }
        set.order.insert((score, member.to_owned()));
    }

    /// `ZREM key member`: `true` when it was there. An emptied set is deleted.
    pub(crate) fn zrem(&mut self, key: &str, member: &str) -> bool {
        let Some(set) = self.zset(key) else {
            return false;
        };
        let Some(score) = set.scores.remove(member) else {
            return false;
        };
        set.order.remove(&(score, member.to_owned()));
        if set.scores.is_empty() {
            self.items.remove(key);
        }
        true
    }

    /// `ZSCORE key member`.
    pub(crate) fn zscore(&mut self, key: &str, member: &str) -> Option<i64> {
        self.zset(key)?.scores.get(member).copied()
    }

    /// `ZCARD key`.
    pub(crate) fn zcard(&mut self, key: &str) -> usize {
        self.zset(key).map_or(0, |set| set.scores.len())
    }

    /// `ZRANGE key 0 0 WITHSCORES`: the lowest member.
    pub(crate) fn zfirst(&mut self, key: &str) -> Option<(String, i64)> {
        let (score, member) = self.zset(key)?.order.first()?.clone();
        Some((member, score))
    }

    /// `ZRANGE key -1 -1 WITHSCORES`: the highest member.
    pub(crate) fn zlast(&mut self, key: &str) -> Option<(String, i64)> {
        let (score, member) = self.zset(key)?.order.last()?.clone();
        Some((member, score))
    }

    /// `ZREMRANGEBYSCORE key -inf max`. An emptied set is deleted.
    pub(crate) fn zremrange_upto(&mut self, key: &str, max: i64) {
        let Some(set) = self.zset(key) else {
            return;
        };
        while let Some((score, member)) = set.order.first().cloned() {
            if score > max {
                break;
            }
            set.order.remove(&(score, member.clone()));
            set.scores.remove(&member);
        }
        if set.scores.is_empty() {
            self.items.remove(key);
        }
    }

    /// `ZCOUNT key (min +inf`: members scored above `min`.
    pub(crate) fn zcount_above(&mut self, key: &str, min: i64) -> usize {
        self.zset(key)
            .map_or(0, |set| set.order.range((min + 1, String::new())..).count())
    }

    /// `ZRANGEBYSCORE key (min +inf LIMIT 0 1`: the lowest member scored above `min`.
    pub(crate) fn zfirst_above(&mut self, key: &str, min: i64) -> Option<String> {
        let set = self.zset(key)?;
        let (_, member) = set.order.range((min + 1, String::new())..).next()?;
        Some(member.clone())
    }
}

/// The instant a set server clock counts from (its 0 µs), one per process.
#[cfg(distlock_test_hooks)]
fn clock_epoch() -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

/// One live key as [`Keyspace::snapshot`] gives it: its name, its value, and when it expires on
/// the set clock (µs; `None`: never).
#[cfg(distlock_test_hooks)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stored {
    /// The key's name.
    pub key: String,
    /// Its value.
    pub value: StoredValue,
    /// When it expires, in µs on the set clock (`None`: never).
    pub expires_us: Option<u64>,
}

/// A key's value in a [`Stored`]: a string, or a sorted set's members in order.
#[cfg(distlock_test_hooks)]
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoredValue {
    /// A string.
    String(String),
    /// A sorted set: (score, member), in Redis's order.
    SortedSet(Vec<(i64, String)>),
}

#[cfg(distlock_test_hooks)]
impl Keyspace {
    /// Every live key at the set clock, sorted by name: a value to compare and hash (the model
    /// checker's state). Needs the clock set.
    pub(crate) fn snapshot(&mut self) -> Vec<Stored> {
        let now = self.now();
        let mut stored: Vec<Stored> = self
            .items
            .iter()
            .filter(|(_, item)| item.expires_at.is_none_or(|at| at > now))
            .map(|(key, item)| Stored {
                key: key.clone(),
                value: match &item.data {
                    Data::String(value) => StoredValue::String(value.clone()),
                    Data::SortedSet(set) => {
                        StoredValue::SortedSet(set.order.iter().cloned().collect())
                    }
                },
                expires_us: item
                    .expires_at
                    .map(|at| at.duration_since(clock_epoch()).as_micros() as u64),
            })
            .collect();
        stored.sort();
        stored
    }

    /// A keyspace holding `stored`, its clock at `now_us`.
    pub(crate) fn restore(stored: &[Stored], now_us: u64) -> Keyspace {
        let mut keys = Keyspace::default();
        keys.set_clock(now_us);
        for one in stored {
            let data = match &one.value {
                StoredValue::String(value) => Data::String(value.clone()),
                StoredValue::SortedSet(members) => Data::SortedSet(SortedSet {
                    scores: members
                        .iter()
                        .map(|(score, member)| (member.clone(), *score))
                        .collect(),
                    order: members.iter().cloned().collect(),
                }),
            };
            let expires_at = one
                .expires_us
                .map(|us| clock_epoch() + Duration::from_micros(us));
            keys.items
                .insert(one.key.clone(), Item { data, expires_at });
        }
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_sets_behave_as_redis_does() {
        let mut keys = Keyspace::default();
        assert_eq!(keys.pttl("a"), -2);
        keys.set("a", "L1 x".into(), Ttl::Px(10_000));
        assert!(keys.pttl("a") > 9_000);
        keys.set_first("a", b'W');
        assert_eq!(keys.get("a").as_deref(), Some("W1 x"));
        keys.set("a", "F1".into(), Ttl::Keep);
        assert!(keys.pttl("a") > 9_000, "KEEPTTL kept it");
        assert!(!keys.set_existing("b", "v".into(), 100));
        assert!(keys.set_existing("a", "v".into(), 100));
        keys.zadd("q", 5, "m5");
        keys.zadd("q", 1, "m1");
        keys.zadd("q", 9, "m9");
        assert_eq!(keys.zfirst("q"), Some(("m1".into(), 1)));
        assert_eq!(keys.zlast("q"), Some(("m9".into(), 9)));
        assert_eq!(keys.zcount_above("q", 1), 2);
        assert_eq!(keys.zfirst_above("q", 1).as_deref(), Some("m5"));
        keys.zadd("q", 10, "m1");
        assert_eq!(keys.zfirst("q"), Some(("m5".into(), 5)));
        keys.zremrange_upto("q", 9);
        assert_eq!(keys.zcard("q"), 1);
        assert!(keys.zrem("q", "m1"));
        assert!(!keys.exists("q"), "an emptied set is gone");
        assert!(keys.pexpire("a", 0));
        assert!(!keys.exists("a"), "expired at once");
    }
}
