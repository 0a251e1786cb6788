//! One request to every master at once, each bounded by the per-master timeout: the masters are
//! asked in parallel, never one after another, and the answers are read as they come, so a
//! decided outcome (a quorum granted, a quorum impossible) need not wait for a slow or paused
//! master. A request not waited for may or may not run: callers settle early only where either
//! is harmless (a vote they will release, a renewal of a lease already lost), and wait for every
//! answer where it is not (releases, renewals of a lease that holds).

use crate::engines::engine::{EngineFailure, EngineResult};
use futures_util::stream::{FuturesUnordered, StreamExt};
use std::future::Future;
use std::time::Duration;

/// The answers of one fan-out, in master order; `None` for a master not waited for.
pub(crate) type Answers<T> = Vec<Option<EngineResult<T>>>;

/// Runs `request` on every item of `masters` in parallel, until `settled` says the answers so far
/// decide the outcome or every master answered; a request that has not answered within
/// `timeout` counts as failed, and ambiguous (it may still run on its server).
///
/// # Cancel safety
/// Not cancel safe: requests already sent still run.
/// Dropping the future drops the requests' futures; those already sent still run on their
/// servers, like lost replies. Callers keep what they need to undo them (the owner token).
pub(crate) async fn fan_out<'m, M, T, F, Fut>(
    masters: impl IntoIterator<Item = &'m M>,
    timeout: Duration,
    request: F,
    settled: impl Fn(&Answers<T>) -> bool,
) -> Answers<T>
where
    M: 'm,
    F: Fn(&'m M) -> Fut,
    Fut: Future<Output = EngineResult<T>>,
{
    let mut pending: FuturesUnordered<_> = masters
        .into_iter()
        .enumerate()
        .map(|(index, master)| {
            let answer = request(master);
            async move { (index, answer.await) }
        })
        .collect();
    let mut answers: Answers<T> = (0..pending.len()).map(|_| None).collect();
    // One timer for the whole fan-out: every request started together, so one deadline bounds
    // them all (a timer per master cost one registration per request on the hot path).
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            biased;
            next = pending.next() => {
                let Some((index, answer)) = next else { break };
                answers[index] = Some(answer);
                if settled(&answers) {
                    break;
                }
            }
            () = &mut deadline => {
                for answer in answers.iter_mut().filter(|answer| answer.is_none()) {
                    *answer = Some(Err(EngineFailure::ambiguous(format!(
                        "no answer within the per-master timeout of {timeout:?}"
                    ))));
                }
                break;
            }
        }
    }
    answers
}

/// Waits for every master (within the timeout).
pub(crate) fn all<T>(_: &Answers<T>) -> bool {
    false
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
