//! The Redis lock protocol, in one place: what a lock key holds on a Redis server, what each Lua
//! script takes and answers. The scripts (`../scripts/*.lua`) write and read these values and
//! return these codes; the Redis engines and the in-process engine (the scripts' Rust twin)
//! decode every reply here, exhaustively: a reply this client does not know is an error that
//! names the script and the value (processes of two versions sharing a prefix fail loudly),
//! never a guess. Engines that are not the scripts (etcd's queue) have protocols of their own.
//!
//! # The lock value
//! A lock is one string key, `<prefix>:{<key>}`, whose first byte is its [`State`]:
//!
//! | value | state | meaning |
//! |---|---|---|
//! | `L<token> <owner>[ <label>]` | [`State::Held`] | held; nobody was told it is busy |
//! | `H<token> <owner>[ <label>]` | [`State::HeldQueued`] | held; only processes in its queue were told it is busy: the release hands it to the first of them |
//! | `W<token> <owner>[ <label>]` | [`State::HeldWaitedOn`] | held; someone unqueued was told it is busy (a reader, a waiter with no room in the queue, a Redlock waiter): the release announces itself |
//! | `F<token>` | [`State::Free`] | free: the token marker a release leaves, so that the next token is larger |
//! | `P<token> <until µs>` | [`State::Reserved`] | free, and the waiters the release notified have it first until server time `until` |
//! | `Q<token> <until µs>` | [`State::ReservedTurnedAway`] | the same, and someone was turned away meanwhile: the notified waiter that takes it holds it as `W` |
//! | `V<token> <until µs>` | [`State::ReservedForWriter`] | freed by the last reader for the writer that waits: no reader may take it meanwhile |
//! | `R<token>` | [`State::ReadHeld`] | held by readers, each with its own lease in `<lock>:holders` |
//! | `S<token> <until µs>` | [`State::ReadHeldWriterWaits`] | the same, and a writer waits: new readers queue behind it until `until` |
//! | `M<token>` | [`State::Permits`] | a semaphore with holders (`<lock>:holders`) |
//! | `N<token>` | [`State::PermitsRefused`] | the same, and someone was told it is full: a release announces itself |
//!
//! Beside it, in the same Cluster slot: `<lock>:holders` (a sorted set: a reader's or permit's
//! `<owner> <label>`, scored by its lease's expiry in server ms), `<lock>:queue` and
//! `<lock>:queue:<owner>` (the processes waiting for an exclusive lock: `scripts/queue.lua`),
//! and the channel `<lock>:released`. The owner token never contains a space; the label (who
//! holds it, for operators) may.
//!
//! # The replies
//! One type per script: [`Acquire`] (`acquire.lua`), [`Release`] (`release.lua`), [`Renew`]
//! (`renew.lua`), [`SharedAcquire`] (`shared_acquire.lua`), [`SharedRelease`]
//! (`shared_release.lua`), [`FenceWriteback`] (`fence_writeback.lua`). `inspect.lua` and
//! `unlock.lua` answer a holder's fields (`engines/redis/node/operator.rs`).

mod replies;
mod value;

use crate::engines::engine::Asker;

/// Times as the scripts take and answer them: whole milliseconds.
pub(crate) mod millis {
    use std::time::Duration;

    /// A time the scripts answer; `None` when they could not say (a negative `PTTL`: no key,
    /// or no TTL).
    pub(crate) fn decode(ms: i64) -> Option<Duration> {
        u64::try_from(ms).ok().map(Duration::from_millis)
    }

    /// A time as the scripts answer it (`-1` for none): the twin's side of [`decode`].
    #[cfg(any(test, distlock_test_hooks))]
    pub(crate) fn encode(time: Option<Duration>) -> i64 {
        time.map_or(-1, |time| time.as_millis() as i64)
    }

    /// A time as a script argument: whole milliseconds, at least 1 (`PX 0` is an error).
    pub(crate) fn arg(time: Duration) -> u64 {
        (time.as_millis() as u64).max(1)
    }
}

/// Who asks, as `acquire.lua` and `shared_acquire.lua` take it: `0` a single try, `1` the
/// first try of a caller that will wait, `2` a waiter.
pub(crate) const fn asker_arg(asker: Asker) -> u8 {
    match asker {
        Asker::Once => b'0',
        Asker::WillWait => b'1',
        Asker::Waiting => b'2',
    }
}

/// [`asker_arg`] as a one-byte string, borrowed where an argument list takes it.
pub(crate) const fn asker_bytes(asker: Asker) -> &'static [u8] {
    const ONCE: [u8; 1] = [asker_arg(Asker::Once)];
    const WILL_WAIT: [u8; 1] = [asker_arg(Asker::WillWait)];
    const WAITING: [u8; 1] = [asker_arg(Asker::Waiting)];
    match asker {
        Asker::Once => &ONCE,
        Asker::WillWait => &WILL_WAIT,
        Asker::Waiting => &WAITING,
    }
}

/// [`asker_arg`]'s reverse, where an argument is read (the twin's entry points).
#[cfg(any(test, distlock_test_hooks))]
pub(crate) fn asker_of(arg: u8) -> Option<Asker> {
    [Asker::Once, Asker::WillWait, Asker::Waiting]
        .into_iter()
        .find(|asker| asker_arg(*asker) == arg)
}

pub(crate) use replies::{
    Acquire, FenceWriteback, Release, Renew, SharedAcquire, SharedRelease, UnknownReply,
};
pub(crate) use value::{LockValue, State};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn who_asks_is_one_byte_each_way() {
        for asker in [Asker::Once, Asker::WillWait, Asker::Waiting] {
            assert_eq!(asker_of(asker_arg(asker)), Some(asker));
        }
        assert_eq!(asker_arg(Asker::Waiting), b'2');
        assert_eq!(asker_of(b'3'), None);
    }
}
