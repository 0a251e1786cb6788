//! Redis errors turned into failures that say what to do: a missing ACL permission, rejected
//! credentials, an untrusted TLS certificate. The server's own words stay in the message; the
//! advice is added after them.

use crate::engines::engine::EngineFailure;
use crate::util::advised::Advised;
use crate::util::tls_advice::{self, chain_mentions, Hints};

/// What a failed command means for the lock: whether it may have run although no reply was read
/// (a timeout, or a connection that broke after the request was written), and advice for the
/// causes a user can fix.
pub(crate) fn failure(err: redis::RedisError, prefix: &str) -> EngineFailure {
    let advice = advice(&err, prefix);
    // A TLS handshake that failed never carried the command.
    let handshake_failed = matches!(advice, Some(Advice::Tls(_)));
    let ambiguous = !handshake_failed
        && (err.is_timeout()
            || err.is_connection_dropped()
            || (err.is_io_error() && !err.is_connection_refusal()));
    let source: Box<dyn std::error::Error + Send + Sync> = match advice {
        Some(Advice::Tls(advice) | Advice::Other(advice)) => {
            Box::new(Advised { error: err, advice })
        }
        None => Box::new(err),
    };
    EngineFailure { ambiguous, source }
}

enum Advice {
    /// The TLS handshake failed.
    Tls(String),
    Other(String),
}

/// `true` when retrying cannot help: the server refused the command (a permission, an unknown
/// command, a wrong password) or the client is misconfigured.
pub(crate) fn is_permanent(err: &redis::RedisError) -> bool {
    matches!(
        err.kind(),
        redis::ErrorKind::Server(_)
            | redis::ErrorKind::Extension
            | redis::ErrorKind::AuthenticationFailed
            | redis::ErrorKind::InvalidClientConfig
    )
}

fn advice(err: &redis::RedisError, prefix: &str) -> Option<Advice> {
    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
        return Some(Advice::Other(format!(
            "the Redis user lacks a permission distlock needs; grant it the rules \
             `distlock::redis::acl_rules(\"{prefix}\")` returns — on a Redis Cluster, \
             `distlock::redis::cluster_acl_rules(\"{prefix}\")`, on every node — (keys and \
             release channels under the prefix, the scripts, (S)SUBSCRIBE and (S)PUBLISH)"
        )));
    }
    if err.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(err.code(), Some("WRONGPASS" | "NOAUTH"))
    {
        return Some(Advice::Other(
            "the server rejected the credentials; check the user name and password in the URL"
                .to_owned(),
        ));
    }
    if chain_mentions(err, "wrongtype") {
        return Some(Advice::Other(foreign_value(&format!(
            "a key under the prefix `{prefix}`"
        ))));
    }
    // A server that wants a client certificate says so (`certificate_required`) when none came.
    let hints = Hints::builder("a server without TLS takes the redis:// scheme", true);
    tls_advice::advice(err, &hints).map(Advice::Tls)
}

/// A script found `lock` holding a value distlock did not write: refused, not ambiguous (the
/// script changed nothing).
pub(crate) fn foreign_key(lock: &str) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: foreign_value(&format!("the key {lock}")).into(),
    }
}

/// What to do about `what` (a key, or "a key under the prefix …") holding a value distlock did
/// not write: the acquire script's answer for a foreign string, and the advice on WRONGTYPE.
pub(crate) fn foreign_value(what: &str) -> String {
    format!(
        "{what} holds a value distlock did not write (another program uses these names, or a \
         distlock from before the one-string lock layout does: upgrade every process of a prefix \
         together); choose another prefix (BackendBuilder::prefix or DISTLOCK_PREFIX)"
    )
}
