//! The in-process scripts as the differential test drives them (`tests/protocol.rs`): each call
//! takes the arguments its `.lua` twin takes and answers what the Lua script answers, as raw
//! integers, so that the two can be compared step by step. Compiled with the test hooks only
//! (`cfg(distlock_test_hooks)`, runtime/build.rs).

use super::keyspace::{Keyspace, Ttl};
use super::scripts::{
    self, AcquireCall, Asking, Holding, Published, ReleaseCall, RenewCall, Settings, Sharing,
};
use crate::engines::engine::Asker;
use crate::engines::redis::protocol::{self, Acquire};

pub use super::keyspace::{Stored, StoredValue};
pub use super::scripts::Mutation;

/// The Lua sources, by script name (`acquire`, `release`, `renew`, `shared_acquire`,
/// `shared_release`, `inspect`, `unlock`), as the server runs them.
pub fn lua_source(script: &str) -> &'static str {
    crate::engines::redis::scripts::source(script)
}

/// A keyspace in memory and the scripts' Rust twins on it.
pub struct Twin {
    keys: Keyspace,
    settings: Settings,
    published: Published,
}

/// A holder as `inspect.lua` and `unlock.lua` answer it: owner ("" shared), token, PTTL in ms,
/// label, waited on, and for a shared key how many hold it.
pub type HolderReply = (String, u64, i64, String, bool, Option<u64>);

impl Twin {
    /// A twin whose scripts run with these settings (the arguments every call shares).
    pub fn new(
        label: &str,
        grant_ms: u64,
        marker_ttl_ms: u64,
        window_ms: u64,
        hands_over: bool,
    ) -> Twin {
        Twin {
            keys: Keyspace::default(),
            settings: Settings {
                label: label.to_owned(),
                grant_ms,
                marker_ttl_ms,
                window_ms,
                hands_over,
                fenced: true,
                mutation: None,
            },
            published: Published::new(),
        }
    }

    /// The same twin for efficiency locks: grants carry token 0 and releases delete the key
    /// (`acquire.lua`'s clock step 0, `release.lua`'s marker TTL 0).
    pub fn without_tokens(mut self) -> Twin {
        self.settings.fenced = false;
        self
    }

    /// An efficiency lock's first try, `SET <lock> "L0 <owner>[ <label>]" NX PX <ttl>`: `true`
    /// when it took the lock.
    pub fn claim(&mut self, lock: &str, owner: &str, ttl_ms: u64) -> bool {
        scripts::claim(&mut self.keys, &self.settings, lock, owner, ttl_ms)
    }

    /// `delete_if.lua` for one key granted to `owner` on a first try (the value a claim or
    /// `acquire.lua` writes with token 0): 1 when it still held that value and was deleted.
    pub fn delete_if(&mut self, lock: &str, owner: &str) -> i64 {
        let label = self.settings.label.as_bytes();
        let granted = protocol::LockValue::held(protocol::State::Held, 0, owner, label);
        match self.keys.get(lock) {
            Some(value) if value.as_bytes() == granted => i64::from(self.keys.del(lock)),
            _ => 0,
        }
    }

    /// The server clock from now on, in µs since the epoch (the real clock when not set); TTLs
    /// run on it once it is set.
    pub fn set_clock(&mut self, now_us: u64) {
        self.keys.set_clock(now_us);
    }

    /// Runs the scripts with `mutation` in place of the right transition from now on.
    pub fn set_mutation(&mut self, mutation: Option<Mutation>) {
        self.settings.mutation = mutation;
    }

    /// Every live key, sorted by name, at the set clock (which must be set).
    pub fn snapshot(&mut self) -> Vec<Stored> {
        self.keys.snapshot()
    }

    /// The keyspace replaced by `stored`, the clock set to `now_us`.
    pub fn restore(&mut self, stored: &[Stored], now_us: u64) {
        self.keys = Keyspace::restore(stored, now_us);
    }

    /// `acquire.lua` for one key: its two integers.
    pub fn acquire(
        &mut self,
        lock: &str,
        owner: &str,
        ttl_ms: u64,
        asker: u8,
        ticket: Option<u64>,
    ) -> [i64; 2] {
        let call = AcquireCall {
            lock: lock.to_owned(),
            owner: owner.to_owned(),
            ttl_ms,
            asking: Asking {
                asker: asker_of(asker),
                ticket,
            },
        };
        scripts::acquire(&mut self.keys, &self.settings, &[call])[0].encode()
    }

    /// `release.lua` for one key: its answer (a pair only for a transfer: `[5, token]`).
    pub fn release(
        &mut self,
        lock: &str,
        owner: &str,
        successor: Option<(&str, u64, Option<u64>, bool)>,
        keeps_place: bool,
    ) -> Vec<i64> {
        let call = ReleaseCall {
            lock: lock.to_owned(),
            owner: owner.to_owned(),
            successor: successor
                .map(|(token, ttl, grant, ahead)| (token.to_owned(), ttl, grant, ahead)),
            keeps_place,
        };
        scripts::release(&mut self.keys, &self.settings, &[call], &mut self.published)[0].encode()
    }

    /// `renew.lua` for one lease (`shared`: `owner` is the holder's member).
    pub fn renew(&mut self, lock: &str, owner: &str, shared: bool, ttl_ms: u64) -> i64 {
        let call = RenewCall {
            lock: lock.to_owned(),
            owner: owner.to_owned(),
            shared,
            ttl_ms,
        };
        scripts::renew(&mut self.keys, &[call])[0].encode()
    }

    /// `shared_acquire.lua`: `permits` 0 for a reader.
    pub fn shared_acquire(
        &mut self,
        lock: &str,
        permits: u32,
        member: &str,
        ttl_ms: u64,
        asker: u8,
    ) -> [i64; 2] {
        let sharing = match permits {
            0 => Sharing::Reader,
            n => Sharing::Permit(n),
        };
        let answer = scripts::shared_acquire(
            &mut self.keys,
            lock,
            sharing,
            member,
            ttl_ms,
            asker_of(asker),
        );
        Acquire::from(answer).encode()
    }

    /// `shared_release.lua`.
    pub fn shared_release(&mut self, lock: &str, member: &str) -> i64 {
        let answer = scripts::shared_release(
            &mut self.keys,
            &self.settings,
            lock,
            member,
            &mut self.published,
        );
        answer.encode()
    }

    /// `inspect.lua`: the holder, `None` when free; `Err` for a value distlock did not write.
    pub fn inspect(&mut self, lock: &str) -> Result<Option<HolderReply>, String> {
        scripts::inspect(&mut self.keys, lock).map(|found| found.map(reply))
    }

    /// `unlock.lua`.
    pub fn unlock(&mut self, lock: &str) -> Result<Option<HolderReply>, String> {
        scripts::unlock(&mut self.keys, &self.settings, lock, &mut self.published)
            .map(|found| found.map(reply))
    }

    /// `GET key`.
    pub fn get(&mut self, key: &str) -> Option<String> {
        self.keys.get(key)
    }

    /// `SET key value` (no TTL): a value distlock did not write.
    pub fn set(&mut self, key: &str, value: &str) {
        self.keys.set(key, value.to_owned(), Ttl::Px(60_000));
    }

    /// `PEXPIRE key 0`: the key gone now, as if its TTL ran out.
    pub fn expire(&mut self, key: &str) {
        self.keys.pexpire(key, 0);
    }

    /// `ZRANGE key 0 -1 WITHSCORES`.
    pub fn zrange(&mut self, key: &str) -> Vec<(String, i64)> {
        self.keys.zrange_all(key)
    }

    /// The messages published so far, taken: (channel, message).
    pub fn take_published(&mut self) -> Vec<(String, String)> {
        std::mem::take(&mut self.published)
    }
}

/// Who asks, from the argument the scripts take (`0`, `1` or `2`).
fn asker_of(arg: u8) -> Asker {
    protocol::asker_of(arg).expect("acquire.lua takes 0, 1 or 2 for who asks")
}

fn reply(holding: Holding) -> HolderReply {
    (
        holding.owner,
        holding.token,
        holding.pttl_ms,
        holding.label,
        holding.waited_on,
        holding.shared,
    )
}
