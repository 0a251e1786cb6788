//! Every script's reply as a type, decoded exhaustively from the integers the scripts return
//! (and encoded back, for the scripts' Rust twin), and what each means to an engine.

use super::millis;
use crate::engines::engine::{Acquired, EngineFailure, EngineResult, Ownership};
use crate::lock::kind::LockKind;
use std::time::Duration;

/// A reply of `script` this client does not know: the server runs a script of another version,
/// or the reply was mangled on its way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UnknownReply {
    pub(crate) script: &'static str,
    pub(crate) reply: String,
}

impl UnknownReply {
    pub(crate) fn new(script: &'static str, reply: impl std::fmt::Debug) -> UnknownReply {
        UnknownReply {
            script,
            reply: format!("{reply:?}"),
        }
    }
}

impl std::fmt::Display for UnknownReply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} answered {}, which this version of distlock does not know; processes of \
             different versions may share the prefix: upgrade them together, or give each \
             version a prefix of its own",
            self.script, self.reply
        )
    }
}

impl std::error::Error for UnknownReply {}

/// A script answered what this client does not know: an error, and ambiguous — the script ran,
/// and whatever it did (a grant, a release) may have happened.
impl From<UnknownReply> for EngineFailure {
    fn from(reply: UnknownReply) -> EngineFailure {
        EngineFailure {
            ambiguous: true,
            source: Box::new(reply),
        }
    }
}

/// `acquire.lua`'s answer for one key: two integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquire {
    /// `1, token`: acquired (or already the caller's: an idempotent retry, or a handover
    /// confirmed by asking).
    Granted { token: u64 },
    /// `0, pttl`: another owner holds it for `pttl` more (or the first queued waiter has it).
    Busy { pttl: Option<Duration> },
    /// `4, pttl`: the same, and the caller is queued for it, in the place it had: a release
    /// hands it over; `7, pttl`: queued at the back, with a new place (`anew`), the caller
    /// having had none that lived.
    Queued { pttl: Option<Duration>, anew: bool },
    /// `3, left`: free, but reserved for the waiters a release notified, `left` more.
    Reserved { left: Option<Duration> },
    /// `-2, 0`: the key holds a value distlock did not write.
    ForeignValue,
    /// `-3, 0`: the key is a semaphore (or a lock taken as a semaphore).
    OtherKind,
}

impl Acquire {
    pub(crate) const SCRIPT: &'static str = "acquire.lua";

    pub(crate) fn decode(code: i64, value: i64) -> Result<Acquire, UnknownReply> {
        Ok(match (code, value) {
            // Token 0: an efficiency lock's grant (clock step 0).
            (1, token) if token >= 0 => Acquire::Granted {
                token: token as u64,
            },
            (0, pttl) => Acquire::Busy {
                pttl: millis::decode(pttl),
            },
            (4, pttl) => Acquire::Queued {
                pttl: millis::decode(pttl),
                anew: false,
            },
            (7, pttl) => Acquire::Queued {
                pttl: millis::decode(pttl),
                anew: true,
            },
            (3, left) => Acquire::Reserved {
                left: millis::decode(left),
            },
            (-2, _) => Acquire::ForeignValue,
            (-3, _) => Acquire::OtherKind,
            _ => return Err(UnknownReply::new(Self::SCRIPT, [code, value])),
        })
    }

    /// The two integers the script answers with.
    #[cfg(any(test, distlock_test_hooks))]
    pub(crate) fn encode(self) -> [i64; 2] {
        match self {
            Acquire::Granted { token } => [1, token as i64],
            Acquire::Busy { pttl } => [0, millis::encode(pttl)],
            Acquire::Queued { pttl, anew } => [if anew { 7 } else { 4 }, millis::encode(pttl)],
            Acquire::Reserved { left } => [3, millis::encode(left)],
            Acquire::ForeignValue => [-2, 0],
            Acquire::OtherKind => [-3, 0],
        }
    }

    /// What the answer means for a caller that asked for `lock` as `kind`: `next` is how long
    /// a place the script queued the caller in lasts (the grant time); `foreign` says, in the
    /// engine's words, that the key holds a value distlock did not write.
    pub(crate) fn acquired(
        self,
        next: Option<Duration>,
        lock: &str,
        kind: LockKind,
        foreign: impl FnOnce() -> EngineFailure,
    ) -> EngineResult<Acquired> {
        Ok(match self {
            Acquire::Granted { token } => Acquired::Yes { fence: token },
            Acquire::Busy { pttl } => Acquired::busy(pttl),
            Acquire::Queued { pttl, anew } => match next {
                Some(next) => Acquired::queued(pttl, next, anew),
                None => Acquired::busy(pttl),
            },
            Acquire::Reserved { left } => Acquired::reserved(left),
            Acquire::ForeignValue => return Err(foreign()),
            Acquire::OtherKind => return Err(EngineFailure::kind_mismatch(lock, kind)),
        })
    }
}

/// `release.lua`'s answer for one key: an integer, or `{5, token}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    /// `1`: released (and announced if it was waited on).
    Released,
    /// `2`: released, but the server refused the announcement (the user may not publish).
    ReleasedUnannounced,
    /// `3`: released and handed over to the first queued waiter.
    HandedOver,
    /// `6`: the same, and the successor named is queued for the handed-over lock.
    HandedOverSuccessorQueued,
    /// `0`: the lock is free: it expired before the release.
    Expired,
    /// `-1`: another owner holds it (or another program wrote the key): left untouched.
    TakenOver,
    /// `{5, token}`: transferred to the successor named, which holds it with this token.
    Transferred { token: u64 },
}

impl Release {
    pub(crate) const SCRIPT: &'static str = "release.lua";

    /// The answer `code` (with `token` when the script answered a pair).
    pub(crate) fn decode(code: i64, token: Option<i64>) -> Result<Release, UnknownReply> {
        Ok(match (code, token) {
            (1, None) => Release::Released,
            (2, None) => Release::ReleasedUnannounced,
            (3, None) => Release::HandedOver,
            (6, None) => Release::HandedOverSuccessorQueued,
            (0, None) => Release::Expired,
            (-1, None) => Release::TakenOver,
            (5, Some(token)) if token >= 0 => Release::Transferred {
                token: token as u64,
            },
            _ => return Err(UnknownReply::new(Self::SCRIPT, (code, token))),
        })
    }

    /// The integer the script answers with (a pair only for a transfer: `[5, token]`).
    #[cfg(any(test, distlock_test_hooks))]
    pub(crate) fn encode(self) -> Vec<i64> {
        match self {
            Release::Released => vec![1],
            Release::ReleasedUnannounced => vec![2],
            Release::HandedOver => vec![3],
            Release::HandedOverSuccessorQueued => vec![6],
            Release::Expired => vec![0],
            Release::TakenOver => vec![-1],
            Release::Transferred { token } => vec![5, token as i64],
        }
    }
}

/// `renew.lua`'s answer for one lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renew {
    /// `1`: still the caller's; its TTL is reset.
    Renewed,
    /// `0`: free (expired, released, removed).
    Gone,
    /// `-1`: another owner holds it.
    TakenOver,
}

impl Renew {
    pub(crate) const SCRIPT: &'static str = "renew.lua";

    pub(crate) fn decode(code: i64) -> Result<Renew, UnknownReply> {
        Ok(match code {
            1 => Renew::Renewed,
            0 => Renew::Gone,
            -1 => Renew::TakenOver,
            _ => return Err(UnknownReply::new(Self::SCRIPT, code)),
        })
    }

    /// The integer the script answers with.
    #[cfg(any(test, distlock_test_hooks))]
    pub(crate) fn encode(self) -> i64 {
        match self {
            Renew::Renewed => 1,
            Renew::Gone => 0,
            Renew::TakenOver => -1,
        }
    }
}

impl From<Renew> for Ownership {
    fn from(renew: Renew) -> Ownership {
        match renew {
            Renew::Renewed => Ownership::Ours,
            Renew::Gone => Ownership::Gone,
            Renew::TakenOver => Ownership::TakenOver,
        }
    }
}

/// `shared_acquire.lua`'s answer: two integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedAcquire {
    /// `1, token`: a reader (or a permit) granted, or already the caller's.
    Granted { token: u64 },
    /// `0, ms`: busy for about `ms` more (a writer holds or waits, or no permit is free).
    Busy { ms: Option<Duration> },
    /// `3, ms`: free, but reserved for the waiters a release notified, `ms` more.
    Reserved { ms: Option<Duration> },
    /// `-2, 0`: the key holds a value distlock did not write.
    ForeignValue,
    /// `-3, 0`: the key is a lock of another kind.
    OtherKind,
}

impl SharedAcquire {
    pub(crate) const SCRIPT: &'static str = "shared_acquire.lua";

    pub(crate) fn decode(code: i64, value: i64) -> Result<SharedAcquire, UnknownReply> {
        Ok(match (code, value) {
            (1, token) if token > 0 => SharedAcquire::Granted {
                token: token as u64,
            },
            (0, ms) => SharedAcquire::Busy {
                ms: millis::decode(ms),
            },
            (3, ms) => SharedAcquire::Reserved {
                ms: millis::decode(ms),
            },
            (-2, _) => SharedAcquire::ForeignValue,
            (-3, _) => SharedAcquire::OtherKind,
            _ => return Err(UnknownReply::new(Self::SCRIPT, [code, value])),
        })
    }
}

/// A shared holder's answer is an exclusive one that never queues: the same codes, the same
/// meanings.
impl From<SharedAcquire> for Acquire {
    fn from(answer: SharedAcquire) -> Acquire {
        match answer {
            SharedAcquire::Granted { token } => Acquire::Granted { token },
            SharedAcquire::Busy { ms } => Acquire::Busy { pttl: ms },
            SharedAcquire::Reserved { ms } => Acquire::Reserved { left: ms },
            SharedAcquire::ForeignValue => Acquire::ForeignValue,
            SharedAcquire::OtherKind => Acquire::OtherKind,
        }
    }
}

/// `shared_release.lua`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SharedRelease {
    /// `1`: released.
    Released,
    /// `2`: released, but the server refused the announcement.
    ReleasedUnannounced,
    /// `0`: the holder's lease had expired: nothing of it was left.
    Expired,
}

impl SharedRelease {
    pub(crate) const SCRIPT: &'static str = "shared_release.lua";

    pub(crate) fn decode(code: i64) -> Result<SharedRelease, UnknownReply> {
        Ok(match code {
            1 => SharedRelease::Released,
            2 => SharedRelease::ReleasedUnannounced,
            0 => SharedRelease::Expired,
            _ => return Err(UnknownReply::new(Self::SCRIPT, code)),
        })
    }

    /// The integer the script answers with.
    #[cfg(any(test, distlock_test_hooks))]
    pub(crate) fn encode(self) -> i64 {
        match self {
            SharedRelease::Released => 1,
            SharedRelease::ReleasedUnannounced => 2,
            SharedRelease::Expired => 0,
        }
    }
}

/// `fence_writeback.lua`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FenceWriteback {
    /// `1`: the token is recorded where the lock is the caller's.
    Recorded,
    /// `0`: the lock is not the caller's here: nothing was written.
    NotHeld,
}

impl FenceWriteback {
    pub(crate) const SCRIPT: &'static str = "fence_writeback.lua";

    pub(crate) fn decode(code: i64) -> Result<FenceWriteback, UnknownReply> {
        Ok(match code {
            1 => FenceWriteback::Recorded,
            0 => FenceWriteback::NotHeld,
            _ => return Err(UnknownReply::new(Self::SCRIPT, code)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_reply_decodes() {
        assert_eq!(Acquire::decode(1, 17), Ok(Acquire::Granted { token: 17 }));
        assert_eq!(
            Acquire::decode(4, 250),
            Ok(Acquire::Queued {
                pttl: Some(Duration::from_millis(250)),
                anew: false,
            })
        );
        assert_eq!(Acquire::decode(0, -1), Ok(Acquire::Busy { pttl: None }));
        assert_eq!(
            Acquire::decode(7, 5),
            Ok(Acquire::Queued {
                pttl: Some(Duration::from_millis(5)),
                anew: true,
            })
        );
        assert_eq!(Acquire::decode(-3, 0), Ok(Acquire::OtherKind));
        assert_eq!(
            Release::decode(5, Some(9)),
            Ok(Release::Transferred { token: 9 })
        );
        assert_eq!(
            Release::decode(6, None),
            Ok(Release::HandedOverSuccessorQueued)
        );
        assert_eq!(Renew::decode(-1), Ok(Renew::TakenOver));
        assert_eq!(
            SharedRelease::decode(2),
            Ok(SharedRelease::ReleasedUnannounced)
        );
        assert_eq!(FenceWriteback::decode(0), Ok(FenceWriteback::NotHeld));
    }

    #[test]
    fn every_reply_encodes_to_what_decodes_to_it() {
        let time = Some(Duration::from_millis(250));
        for answer in [
            Acquire::Granted { token: 9 },
            Acquire::Busy { pttl: time },
            Acquire::Busy { pttl: None },
            Acquire::Queued {
                pttl: time,
                anew: true,
            },
            Acquire::Queued {
                pttl: time,
                anew: false,
            },
            Acquire::Reserved { left: time },
            Acquire::ForeignValue,
            Acquire::OtherKind,
        ] {
            let [code, value] = answer.encode();
            assert_eq!(Acquire::decode(code, value), Ok(answer));
        }
        for answer in [
            Release::Released,
            Release::ReleasedUnannounced,
            Release::HandedOver,
            Release::HandedOverSuccessorQueued,
            Release::Expired,
            Release::TakenOver,
            Release::Transferred { token: 3 },
        ] {
            let code = answer.encode();
            assert_eq!(Release::decode(code[0], code.get(1).copied()), Ok(answer));
        }
        for answer in [Renew::Renewed, Renew::Gone, Renew::TakenOver] {
            assert_eq!(Renew::decode(answer.encode()), Ok(answer));
        }
        for answer in [
            SharedRelease::Released,
            SharedRelease::ReleasedUnannounced,
            SharedRelease::Expired,
        ] {
            assert_eq!(SharedRelease::decode(answer.encode()), Ok(answer));
        }
    }

    /// A reply this version does not know is an error naming the script and the reply, never
    /// a guess (a guess could call a held lock free).
    #[test]
    fn an_unknown_reply_names_its_script_and_value() {
        let err = Release::decode(7, None).unwrap_err();
        assert_eq!(err.script, "release.lua");
        let message = err.to_string();
        assert!(
            message.contains("release.lua answered (7, None)"),
            "{message}"
        );
        assert!(message.contains("upgrade them together"), "{message}");
        assert!(
            Acquire::decode(1, -1).is_err(),
            "a negative token is not a grant"
        );
        assert_eq!(Acquire::decode(1, 0), Ok(Acquire::Granted { token: 0 }));
        assert!(Acquire::decode(2, 5).is_err());
        assert!(Release::decode(5, None).is_err());
        assert!(Release::decode(1, Some(3)).is_err());
        assert!(Renew::decode(2).is_err());
        assert!(SharedAcquire::decode(4, 0).is_err());
        assert!(SharedRelease::decode(-1).is_err());
        assert!(FenceWriteback::decode(2).is_err());
    }
}
