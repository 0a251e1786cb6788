//! The Lua scripts every Redis backend runs. Scripts are data: each `.lua` file's header gives its
//! KEYS, ARGV and replies. They are sent by SHA (`EVALSHA`); a server that does not know the SHA yet
//! (first use, restart, `SCRIPT FLUSH`) gets the source in the same round trip (`EVAL`).

use once_cell::sync::Lazy;

/// Source of the resource-side fencing script, for users who call it on their own connection.
///
/// See [`FencedStore`](crate::redis::FencedStore) for the contract; the file's header gives KEYS and ARGV.
pub const FENCED_SET_LUA: &str = include_str!("fenced_set.lua");

/// A Lua script with its SHA1, computed once.
pub(crate) struct LuaScript {
    source: &'static str,
    sha: Lazy<String>,
}

impl LuaScript {
    const fn new(source: &'static str, sha: fn() -> String) -> Self {
        LuaScript {
            source,
            sha: Lazy::new(sha),
        }
    }

    /// The script's SHA1, as `EVALSHA` takes it.
    pub(crate) fn sha(&self) -> &str {
        self.sha.as_str()
    }

    /// `EVALSHA <sha> <numkeys> keys… args…`
    pub(crate) fn evalsha(&self, keys: &[&str], args: &[&[u8]]) -> redis::Cmd {
        let mut cmd = Self::sized("EVALSHA", self.sha.len(), keys, args);
        cmd.arg(self.sha.as_str());
        Self::push_keys_and_args(&mut cmd, keys, args);
        cmd
    }

    /// `EVAL <source> <numkeys> keys… args…`: the NOSCRIPT fallback, which also caches the script.
    pub(crate) fn eval(&self, keys: &[&str], args: &[&[u8]]) -> redis::Cmd {
        let mut cmd = Self::sized("EVAL", self.source.len(), keys, args);
        cmd.arg(self.source);
        Self::push_keys_and_args(&mut cmd, keys, args);
        cmd
    }

    /// `name` with room for the script (`script_len` bytes), the key count, `keys` and `args`:
    /// built in place, without the buffers growing argument by argument.
    fn sized(name: &str, script_len: usize, keys: &[&str], args: &[&[u8]]) -> redis::Cmd {
        let count = 3 + keys.len() + args.len();
        let bytes = name.len()
            + script_len
            + 20
            + keys.iter().map(|key| key.len()).sum::<usize>()
            + args.iter().map(|arg| arg.len()).sum::<usize>();
        let mut cmd = redis::Cmd::with_capacity(count, bytes);
        cmd.arg(name);
        cmd
    }

    fn push_keys_and_args(cmd: &mut redis::Cmd, keys: &[&str], args: &[&[u8]]) {
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        for arg in args {
            cmd.arg(*arg);
        }
    }
}

macro_rules! lua_script {
    ($name:ident, $($file:literal),+) => {
        pub(crate) static $name: LuaScript =
            LuaScript::new(concat!($(include_str!($file)),+), || {
                redis::Script::new(concat!($(include_str!($file)),+))
                    .get_hash()
                    .to_owned()
            });
    };
}

/// The source of the script named `name` (`acquire`, `release`, …) as the server runs it, for
/// the differential test (`tests/protocol.rs`).
#[cfg(distlock_test_hooks)]
pub(crate) fn source(name: &str) -> &'static str {
    match name {
        "acquire" => ACQUIRE.source,
        "release" => RELEASE.source,
        "renew" => RENEW.source,
        "inspect" => INSPECT.source,
        "unlock" => UNLOCK.source,
        "shared_acquire" => SHARED_ACQUIRE.source,
        "shared_release" => SHARED_RELEASE.source,
        "delete_if" => DELETE_IF.source,
        other => panic!("no script named {other}"),
    }
}

// The two scripts that keep the queue of waiting processes start with its functions.
lua_script!(ACQUIRE, "queue.lua", "acquire.lua");
lua_script!(RELEASE, "queue.lua", "release.lua");
lua_script!(RENEW, "renew.lua");
lua_script!(INSPECT, "inspect.lua");
lua_script!(UNLOCK, "unlock.lua");
lua_script!(SHARED_ACQUIRE, "shared_acquire.lua");
lua_script!(SHARED_RELEASE, "shared_release.lua");
lua_script!(FENCED_SET, "fenced_set.lua");
lua_script!(FENCE_WRITEBACK, "fence_writeback.lua");
lua_script!(DELETE_IF, "delete_if.lua");
