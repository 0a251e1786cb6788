//! Workload 9 (work in progress, issue 39): open loop. Requests arrive on a Poisson schedule at
//! a fixed offered rate, whatever the library does with them; each acquires one key, reads one
//! key from the data server (`GET`), and releases. A request's latency runs from its
//! *scheduled* arrival to its release, so a queue that forms behind a slow request counts
//! (a closed loop would slow its arrivals instead: coordinated omission).
//!
//! Keys: uniform over 100,000 (uncontended) or Zipf (s = 1.1) over 1,000 (a few hot keys).
//! Every library sees the same arrival times and keys (one seed per measurement).

use crate::clients::Client;
use crate::measure::{quantile, us};
use serde_json::Map;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::Outcome;

/// How the keys of the requests are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Keys {
    /// Uniform over 100,000 keys: almost never contended.
    Uniform,
    /// Zipf with s = 1.1 over 1,000 keys: a few hot keys, real waiting.
    Zipf,
}

impl Keys {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Keys::Uniform => "uniform",
            Keys::Zipf => "zipf",
        }
    }
}

/// A request's wait budget: beyond it, it counts as a timeout.
const BUDGET: Duration = Duration::from_secs(1);

/// A small xorshift: the same schedule and keys for every library.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform in (0, 1].
    fn unit(&mut self) -> f64 {
        ((self.next() >> 11) as f64 + 1.0) / (1u64 << 53) as f64
    }
}

/// The cumulative weights of Zipf(s) over `n` ranks, for sampling by bisection.
fn zipf_table(n: usize, s: f64) -> Vec<f64> {
    let mut total = 0.0;
    let mut table: Vec<f64> = (1..=n)
        .map(|rank| {
            total += 1.0 / (rank as f64).powf(s);
            total
        })
        .collect();
    for weight in &mut table {
        *weight /= total;
    }
    table
}

/// One request of the schedule: when it is due (from the start) and which key it locks.
#[derive(Debug, Clone)]
pub(crate) struct Request {
    pub(crate) due: Duration,
    pub(crate) key: u32,
}

/// A Poisson schedule of `rate` requests per second over `duration`, with keys as `keys` says.
pub(crate) fn schedule(rate: f64, duration: Duration, keys: Keys, seed: u64) -> Vec<Request> {
    let mut rng = Rng(seed | 1);
    let zipf = zipf_table(1_000, 1.1);
    let mut due = 0.0;
    let mut requests = Vec::new();
    loop {
        due += -rng.unit().ln() / rate;
        if due >= duration.as_secs_f64() {
            return requests;
        }
        let key = match keys {
            Keys::Uniform => (rng.next() % 100_000) as u32,
            Keys::Zipf => {
                let u = rng.unit();
                zipf.partition_point(|&weight| weight < u) as u32
            }
        };
        requests.push(Request {
            due: Duration::from_secs_f64(due),
            key,
        });
    }
}

/// What one request did: its latency from its due time, or a timeout; and when it held the key
/// (for the overlap check).
struct Done {
    key: u32,
    latency_ns: u64,
    held: Option<(Instant, Instant)>,
}

/// Runs `requests` against `client` in the open loop: each is started at its due time (a
/// dispatcher thread sleeps, then spins the last stretch, for microsecond precision) and runs
/// as a task of its own.
pub(crate) async fn run(
    client: &Arc<Client>,
    data: &redis::aio::MultiplexedConnection,
    requests: &[Request],
    tag: &str,
) -> Outcome {
    let done: Arc<Mutex<Vec<Done>>> = Arc::new(Mutex::new(Vec::with_capacity(requests.len())));
    let runtime = tokio::runtime::Handle::current();
    let start = Instant::now() + Duration::from_millis(20);
    let dispatch = {
        let (client, data, done) = (client.clone(), data.clone(), done.clone());
        let requests = requests.to_vec();
        let tag = tag.to_owned();
        std::thread::spawn(move || {
            let mut tasks = Vec::with_capacity(requests.len());
            for request in requests {
                let due = start + request.due;
                wait_until(due);
                let (client, mut data, done) = (client.clone(), data.clone(), done.clone());
                let key = format!("open:{tag}:{}", request.key);
                tasks.push(runtime.spawn(async move {
                    let outcome = one(&client, &mut data, &key).await;
                    let latency_ns = due.elapsed().as_nanos() as u64;
                    done.lock().unwrap().push(Done {
                        key: request.key,
                        latency_ns,
                        held: outcome,
                    });
                }));
            }
            tasks
        })
    };
    let tasks = tokio::task::spawn_blocking(move || dispatch.join().expect("the dispatcher"))
        .await
        .map_err(|err| err.to_string())?;
    for task in tasks {
        task.await.map_err(|err| err.to_string())?;
    }
    let elapsed = start.elapsed();
    let done = std::mem::take(&mut *done.lock().unwrap());
    Ok(summarize(done, elapsed))
}

/// Acquire, `GET`, release: when the key was held, or `None` after a timeout or a failure.
async fn one(
    client: &Client,
    data: &mut redis::aio::MultiplexedConnection,
    key: &str,
) -> Option<(Instant, Instant)> {
    let held = tokio::time::timeout(BUDGET, client.acquire(key))
        .await
        .ok()?
        .ok()?;
    let acquired = Instant::now();
    let _: Option<String> = redis::cmd("GET").arg(key).query_async(data).await.ok()?;
    let releasing = Instant::now();
    client.release(held).await.ok()?;
    Some((acquired, releasing))
}

/// Sleeps until just before `due`, then spins to it.
fn wait_until(due: Instant) {
    const SPIN: Duration = Duration::from_micros(60);
    let now = Instant::now();
    if due > now + SPIN {
        std::thread::sleep(due - now - SPIN);
    }
    while Instant::now() < due {
        std::hint::spin_loop();
    }
}

/// Achieved rate, latency percentiles, timeouts and overlapping holds of one measurement.
fn summarize(mut done: Vec<Done>, elapsed: Duration) -> Map<String, serde_json::Value> {
    let completed: Vec<u64> = done
        .iter()
        .filter(|d| d.held.is_some())
        .map(|d| d.latency_ns)
        .collect();
    let timeouts = done.len() - completed.len();
    let mut sorted = completed.clone();
    sorted.sort_unstable();
    // Holds of one key that overlap in time: two holders at once.
    done.sort_by_key(|d| (d.key, d.held.map(|(from, _)| from)));
    let violations = done
        .windows(2)
        .filter(|pair| pair[0].key == pair[1].key)
        .filter(|pair| match (pair[0].held, pair[1].held) {
            (Some((_, first_end)), Some((second_start, _))) => second_start < first_end,
            _ => false,
        })
        .count();
    let mut result = Map::new();
    result.insert("requests".into(), done.len().into());
    result.insert(
        "achieved_per_s".into(),
        (completed.len() as f64 / elapsed.as_secs_f64()).into(),
    );
    if !sorted.is_empty() {
        result.insert("p50_us".into(), us(quantile(&sorted, 0.50)).into());
        result.insert("p99_us".into(), us(quantile(&sorted, 0.99)).into());
        result.insert("p999_us".into(), us(quantile(&sorted, 0.999)).into());
    }
    result.insert("timeouts".into(), timeouts.into());
    result.insert("violations".into(), violations.into());
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisson_schedule_has_its_rate_and_zipf_keys_are_hot() {
        let requests = schedule(10_000.0, Duration::from_secs(2), Keys::Zipf, 7);
        let rate = requests.len() as f64 / 2.0;
        assert!((9_500.0..10_500.0).contains(&rate), "{rate}");
        assert!(requests.windows(2).all(|pair| pair[0].due <= pair[1].due));
        let hottest = requests.iter().filter(|r| r.key == 0).count() as f64;
        // Zipf(1.1) over 1,000 keys: the first rank draws about 17 % of the requests.
        let share = hottest / requests.len() as f64;
        assert!((0.14..0.20).contains(&share), "{share}");
        let uniform = schedule(10_000.0, Duration::from_secs(1), Keys::Uniform, 7);
        assert!(uniform.iter().all(|r| r.key < 100_000));
        assert_eq!(
            schedule(10_000.0, Duration::from_secs(1), Keys::Uniform, 7).len(),
            uniform.len(),
            "the same seed, the same schedule"
        );
    }
}
