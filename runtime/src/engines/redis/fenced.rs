//! Resource-side fencing: the check that makes a lock exact rather than approximately exclusive.

use crate::engines::redis::node::Node;
use crate::engines::redis::scripts::FENCED_SET;
use crate::engines::settings::Timeouts;
use crate::engines::settings::TlsFiles;
use crate::error::Operation;
use crate::error::{BackendError, LockError};
use futures_util::future::BoxFuture;

/// A Redis-held resource that accepts a write only if the writer's fencing token is at least the
/// highest token it has accepted.
///
/// # The contract
/// A lock alone is only approximately exclusive: a holder can be paused (GC, SIGSTOP, a slow
/// page fault) or partitioned past its lease, wake up still believing it holds the lock, and
/// write after the next holder did. Fencing closes that gap: every acquisition gets a token
/// larger than every earlier one for the same key ([`fencing_token()`](crate::fencing_token)),
/// and the *resource* rejects a token older than one it has seen. The check must happen where
/// the write lands — here, atomically inside one Redis script (`FENCED_SET_LUA`); in a SQL
/// database, `UPDATE … WHERE last_token <= $token`.
///
/// Tokens are equal for repeated writes of one holder (accepted) and increase across holders.
///
/// ```no_run
/// # async fn demo() -> Result<(), distlock::LockError> {
/// use distlock::redis::{FencedStore, FencedWrite};
///
/// let ledger = FencedStore::open("redis://127.0.0.1:6379")?;
/// match ledger.write("ledger:7", 1_733_000_000_000_001, b"balance=10").await? {
///     FencedWrite::Applied => {}
///     FencedWrite::Rejected { highest } => eprintln!("stale writer: token {highest} wrote first"),
/// }
/// # Ok(()) }
/// ```
pub struct FencedStore {
    node: Node,
}

/// The outcome of a [`FencedStore::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FencedWrite {
    /// The value was written.
    Applied,
    /// A writer with a newer token wrote first; nothing was written.
    Rejected {
        /// The newest token the resource has accepted.
        highest: u64,
    },
}

impl FencedStore {
    /// A fenced resource store on the Redis at `url` (connects lazily).
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when `url` is not a valid `redis://`, `rediss://`, `unix://`
    /// or `redis+unix://` URL, or is `rediss://` in a build without the `tls` feature.
    pub fn open(url: &str) -> Result<Self, LockError> {
        Ok(FencedStore {
            node: Node::open(url, &TlsFiles::default(), Timeouts::default(), "")?,
        })
    }

    /// Writes `value` to `key` if `token` is at least the highest token accepted for `key`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] (setting `fencing_token`) for token 0, which no fenced lock
    /// is granted with: it is an efficiency lock's
    /// ([`BackendBuilder::fencing_tokens`](crate::BackendBuilder::fencing_tokens)`(false)`),
    /// which cannot fence a write. Nothing is sent.
    ///
    /// [`LockError::Backend`] (its backend named `"fenced"`) when the server did not answer,
    /// refused the script, or answered something other than the script's reply. When the error
    /// [is ambiguous](BackendError::is_ambiguous), the write may have been applied: writing the
    /// same value with the same token again is harmless.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped after the request was sent, the write may or may not have been
    /// applied, as with any lost reply. Writing the same value with the same token again is
    /// harmless (equal tokens are accepted), so retry to learn the outcome.
    pub async fn write(
        &self,
        key: &str,
        token: u64,
        value: &[u8],
    ) -> Result<FencedWrite, LockError> {
        if token == 0 {
            return Err(LockError::invalid_config(
                "fencing_token",
                "is 0, the token of an efficiency lock (a backend built with \
                 fencing_tokens(false)), which cannot fence a write: take the lock on a backend \
                 with fencing tokens",
            ));
        }
        let token = token.to_string();
        let (keys, args) = ([key], [token.as_bytes(), value]);
        // Boxed as a trait object: a caller awaits this inside a locked call, whose future is
        // already deep, and the type of the script call's future (the connection's, redis-rs's)
        // would take the whole of rustc's default recursion limit to prove `Send`.
        let invoke: BoxFuture<'_, _> = Box::pin(self.node.invoke(&FENCED_SET, &keys, &args));
        let reply: Vec<u64> = invoke.await.map_err(|failure| {
            LockError::Backend(BackendError::new(
                "fenced",
                Operation::FencedWrite,
                failure.ambiguous,
                failure.source,
            ))
        })?;
        match reply.as_slice() {
            [1, _] => Ok(FencedWrite::Applied),
            [0, highest] => Ok(FencedWrite::Rejected { highest: *highest }),
            other => Err(LockError::Backend(BackendError::new(
                "fenced",
                Operation::FencedWrite,
                false,
                format!("unexpected reply {other:?}"),
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_efficiency_locks_token_is_refused_before_anything_is_sent() {
        // Nothing listens on port 1: the refusal comes before any connection is tried.
        let store = FencedStore::open("redis://127.0.0.1:1").unwrap();
        let err = store.write("ledger:7", 0, b"x").await.unwrap_err();
        assert!(
            matches!(&err, LockError::InvalidConfig { setting, .. } if setting == "fencing_token"),
            "{err:?}"
        );
        assert!(err.to_string().contains("efficiency lock"), "{err}");
    }
}
