//! The lock protocol, in one place: what a lock key holds on the server, and what each script
//! answers. The scripts (`scripts/*.lua`) write and read these values and return these codes;
//! engines decode every reply here, exhaustively: a reply this client does not know is an error
//! that names the script and the value (processes of two versions sharing a prefix fail
//! loudly), never a guess.
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

pub(crate) use replies::{
    Acquire, FenceWriteback, Release, Renew, SharedAcquire, SharedRelease, UnknownReply,
};
pub(crate) use value::{LockValue, State};
