//! Finding the lock keys under a prefix with `SCAN` (never `KEYS`, which blocks the server for
//! as long as it walks the whole keyspace), for `distlock list` and
//! [`Backend::list`](crate::Backend::list).

use std::future::Future;

/// Keys asked for per `SCAN` step: a step stays short on the server, the walk takes few round
/// trips.
const SCAN_COUNT: usize = 1000;

/// The `SCAN MATCH` pattern for lock keys under `prefix` whose key matches the glob `pattern`:
/// `<prefix>:{<pattern>}`, the prefix's own glob characters escaped.
pub(crate) fn match_pattern(prefix: &str, pattern: &str) -> String {
    let mut escaped = String::with_capacity(prefix.len() + pattern.len() + 3);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped.push_str(":{");
    escaped.push_str(pattern);
    escaped.push('}');
    escaped
}

/// Walks one server's keyspace with `SCAN <cursor> MATCH <pattern> COUNT …`, `step` sending one
/// command; the keys found, each once.
///
/// # Cancel safety
/// Cancel safe.
/// Read-only: `SCAN` keeps no cursor on the server, so dropping the future changes nothing.
pub(crate) async fn walk<F, Fut>(pattern: &str, mut step: F) -> redis::RedisResult<Vec<String>>
where
    F: FnMut(redis::Cmd) -> Fut,
    Fut: Future<Output = redis::RedisResult<(u64, Vec<String>)>>,
{
    let mut keys = Vec::new();
    let mut cursor = 0u64;
    loop {
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(SCAN_COUNT);
        let (next, found) = step(cmd).await?;
        keys.extend(found);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    // SCAN may return a key more than once (the table grew or shrank meanwhile).
    keys.sort_unstable();
    keys.dedup();
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_prefix_is_escaped_and_the_pattern_is_not() {
        assert_eq!(match_pattern("app", "order:*"), "app:{order:*}");
        assert_eq!(match_pattern("a*b[1]", "?"), "a\\*b\\[1\\]:{?}");
    }
}
