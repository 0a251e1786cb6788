//! The safety net under release notifications: full-jitter exponential backoff, bounded by the
//! remaining wait budget and the holder's remaining TTL.

use std::cell::Cell;
use std::future::Future;
use std::time::{Duration, Instant};

/// First backoff ceiling.
const BASE: Duration = Duration::from_millis(1);

/// Full-jitter exponential backoff: the n-th delay is uniform in `[0, min(cap, BASE·2ⁿ)]`. The
/// cap is the worst delay a waiter adds after a release it was not told about.
#[derive(Debug)]
pub(crate) struct Backoff {
    attempt: u32,
    cap: Duration,
    floor: Duration,
}

impl Backoff {
    pub(crate) fn new(cap: Duration) -> Self {
        Backoff {
            attempt: 0,
            cap,
            floor: Duration::ZERO,
        }
    }

    /// Test hook: no sleep shorter than `floor` (still bounded by budget and holder TTL).
    pub(crate) fn with_floor(mut self, floor: Duration) -> Self {
        self.floor = floor;
        self
    }

    /// The next delay, never past the end of the wait budget (`remaining`), and never much past
    /// the moment the holder's lease ends (`holder_ttl`), when the lock is free for sure.
    pub(crate) fn next_delay(
        &mut self,
        remaining: Option<Duration>,
        holder_ttl: Option<Duration>,
    ) -> Duration {
        let ceiling = BASE.saturating_mul(1 << self.attempt.min(16)).min(self.cap);
        self.attempt += 1;
        let mut delay = ceiling.mul_f64(unit_random()).max(self.floor);
        if let Some(ttl) = holder_ttl {
            delay = delay.min(ttl + Duration::from_millis(1));
        }
        if let Some(remaining) = remaining {
            delay = delay.min(remaining);
        }
        delay
    }
}

/// After a failed try (`failure`): tries `attempt` again, after full-jitter backoffs capped at
/// `cap`, until it succeeds or the moment `deadline()` names passes. For work whose failure has a
/// natural end, such as a release tried until the lock would have expired anyway. The error is
/// the last failure (`failure` itself if the deadline had passed already). The deadline is read
/// before each pause, so one that moves (a lease's validity) is followed.
///
/// # Cancel safety
/// As cancel safe as `attempt`.
/// Dropped during a pause, nothing more is tried; dropped during a try, that try's own cancel
/// safety applies.
pub(crate) async fn retry_until<T, E, Fut>(
    deadline: impl Fn() -> Instant,
    cap: Duration,
    mut failure: E,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    let mut backoff = Backoff::new(cap);
    loop {
        let left = deadline().saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(failure);
        }
        tokio::time::sleep(backoff.next_delay(Some(left), None)).await;
        match attempt().await {
            Ok(done) => return Ok(done),
            Err(again) => failure = again,
        }
    }
}

thread_local! {
    static RNG: Cell<u64> = Cell::new({
        let mut seed = [0u8; 8];
        // Jitter needs no secrecy; a fixed seed only loses decorrelation between processes.
        let _ = getrandom::fill(&mut seed);
        u64::from_le_bytes(seed) | 1
    });
}

/// A uniform number in `[0, 1)` from a per-thread xorshift generator.
fn unit_random() -> f64 {
    RNG.with(|state| {
        let mut x = state.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        state.set(x);
        (x >> 11) as f64 / (1u64 << 53) as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_ceiling_budget_and_holder_ttl() {
        let cap = Duration::from_millis(100);
        let mut backoff = Backoff::new(cap);
        for n in 0..40u32 {
            let ceiling = BASE.saturating_mul(1 << n.min(16)).min(cap);
            assert!(backoff.next_delay(None, None) <= ceiling);
        }
        let mut backoff = Backoff {
            attempt: 30,
            ..Backoff::new(Duration::from_millis(100))
        };
        assert!(
            backoff.next_delay(Some(Duration::from_millis(3)), None) <= Duration::from_millis(3)
        );
        assert!(
            backoff.next_delay(None, Some(Duration::from_millis(2))) <= Duration::from_millis(3)
        );
    }

    #[tokio::test]
    async fn retry_until_stops_at_success_or_at_the_deadline() {
        let cap = Duration::from_millis(10);
        let mut tries = 0;
        let third = retry_until(
            || Instant::now() + Duration::from_secs(60),
            cap,
            0,
            || {
                tries += 1;
                let this = tries;
                async move {
                    if this == 3 {
                        Ok(this)
                    } else {
                        Err(this)
                    }
                }
            },
        )
        .await;
        assert_eq!(third, Ok(3), "a success ends the tries");

        let deadline = Instant::now() + Duration::from_millis(200);
        let mut starts = Vec::new();
        let last = retry_until(
            || deadline,
            cap,
            0,
            || {
                starts.push(Instant::now());
                let this = starts.len();
                async move { Err::<(), _>(this) }
            },
        )
        .await;
        assert!(Instant::now() >= deadline, "gave up before the deadline");
        let late = starts.iter().filter(|start| **start > deadline).count();
        assert!(
            late <= 1,
            "{late} tries after the deadline: no pause may end past it"
        );
        assert_eq!(last, Err(starts.len()), "the last failure is returned");
        assert!(
            starts.len() >= 2,
            "retried until the deadline: {}",
            starts.len()
        );

        let passed = Instant::now();
        let first = retry_until(|| passed, cap, 7, || async { Ok::<(), usize>(()) }).await;
        assert_eq!(first, Err(7), "a deadline already passed tries nothing");
    }

    #[test]
    fn jitter_spreads_delays() {
        let mut backoff = Backoff {
            attempt: 30,
            ..Backoff::new(Duration::from_millis(100))
        };
        let delays: Vec<_> = (0..64).map(|_| backoff.next_delay(None, None)).collect();
        let distinct: std::collections::HashSet<_> = delays.iter().collect();
        assert!(
            distinct.len() > 32,
            "full jitter must not repeat delays: {delays:?}"
        );
    }
}
