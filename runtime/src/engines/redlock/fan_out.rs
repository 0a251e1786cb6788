//! One request to every master at once, each bounded by the per-master timeout: the masters are
//! asked in parallel, never one after another, so an attempt costs the slowest answer within
//! the timeout, not the sum.

use crate::engine::{EngineFailure, EngineResult};
use futures_util::future::join_all;
use std::future::Future;
use std::time::Duration;

/// Runs `request` on every item of `masters` in parallel; a request that has not answered within
/// `timeout` counts as failed, and ambiguous (it may still run on its server).
pub(crate) async fn fan_out<'m, M, T, F, Fut>(
    masters: impl IntoIterator<Item = &'m M>,
    timeout: Duration,
    request: F,
) -> Vec<EngineResult<T>>
where
    M: 'm,
    F: Fn(&'m M) -> Fut,
    Fut: Future<Output = EngineResult<T>>,
{
    join_all(masters.into_iter().map(|master| {
        let answer = request(master);
        async move {
            match tokio::time::timeout(timeout, answer).await {
                Ok(answer) => answer,
                Err(_) => Err(EngineFailure {
                    ambiguous: true,
                    source: format!("no answer within the per-master timeout of {timeout:?}")
                        .into(),
                }),
            }
        }
    }))
    .await
}

/// The votes needed out of `masters`: a strict majority.
pub(crate) fn quorum(masters: usize) -> usize {
    masters / 2 + 1
}

/// The summary of failures for an error: how many, whether any may have run, the first reason.
pub(crate) fn summarize(
    what: &str,
    failures: Vec<(String, EngineFailure)>,
    masters: usize,
    needed: usize,
) -> EngineFailure {
    let ambiguous = failures.iter().any(|(_, failure)| failure.ambiguous);
    let count = failures.len();
    let first = failures
        .into_iter()
        .next()
        .map(|(master, failure)| format!("{master}: {}", failure.source))
        .unwrap_or_default();
    EngineFailure {
        ambiguous,
        source: format!(
            "no quorum for {what}: {count} of {masters} masters failed ({needed} must answer); \
             first: {first}"
        )
        .into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_is_a_strict_majority() {
        assert_eq!(
            [3, 4, 5, 6, 7].map(quorum),
            [2, 3, 3, 4, 4],
            "N/2 + 1 masters"
        );
    }
}
