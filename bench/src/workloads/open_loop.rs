//! Workload 9: open loop. Requests arrive on a Poisson schedule at a fixed offered rate,
//! whatever the library does with them; each acquires one key, reads one key from the data
//! server (`GET`), and releases. A request's latency runs from its *scheduled* arrival to its
//! release, so a queue that forms behind a slow request counts (a closed loop would slow its
//! arrivals instead: coordinated omission).
//!
//! The offered rates are fractions of rslock's closed-loop capacity for the same request
//! ([`capacity`]: `--tasks` tasks, acquire + `GET` + release on distinct keys), measured in the
//! same run. Keys: uniform over 100,000 (uncontended) or Zipf (s = 1.1) over 1,000 (a few hot
//! keys). Every library sees the same arrival times and keys (one seed per measurement).

use crate::clients::{run_workers, Client};
use crate::measure::{quantile, us};
use distlock_test_support::Xorshift;
use serde_json::Map;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Outcome, START_DELAY};

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
    // The same seed, the same schedule and keys for every library.
    let mut rng = Xorshift::new(seed);
    let zipf = zipf_table(1_000, 1.1);
    let mut due = 0.0;
    let mut requests = Vec::new();
    loop {
        due += -rng.unit().ln() / rate;
        if due >= duration.as_secs_f64() {
            return requests;
        }
        let key = match keys {
            Keys::Uniform => (rng.next_u64() % 100_000) as u32,
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
/// (for the overlap check and the split of its latency).
struct Done {
    key: u32,
    latency_ns: u64,
    held: Option<Held>,
}

/// A request that held its key: when it started, got the key, read it, and had released it.
#[derive(Clone, Copy)]
struct Held {
    started: Instant,
    acquired: Instant,
    releasing: Instant,
    released: Instant,
}

/// Runs `requests` against `client` in the open loop: each is started at its due time and runs
/// as a task of its own. A dispatcher thread sleeps until the next request is due and starts
/// every request due by the time it wakes. It does not spin, nor ask for a finer timer slack
/// than Linux's default 50 us: on `--pin split` the client has one CPU, and a dispatcher that
/// spins or wakes for every request takes a share of it (measured: rslock's p50 at 25 % went
/// from 394 to 506 us with a 1 ns slack, and every library collapsed at 50 % with spinning).
/// Latency counts from the scheduled arrival, so a late wake-up counts against every library
/// alike.
pub(crate) async fn run(
    client: &Arc<Client>,
    data: &redis::aio::MultiplexedConnection,
    requests: &[Request],
    tag: &str,
) -> Outcome {
    let done: Arc<Mutex<Vec<Done>>> = Arc::new(Mutex::new(Vec::with_capacity(requests.len())));
    let runtime = tokio::runtime::Handle::current();
    let start = Instant::now() + START_DELAY;
    let dispatch = {
        let (client, data, done) = (client.clone(), data.clone(), done.clone());
        let requests = requests.to_vec();
        let tag = tag.to_owned();
        std::thread::spawn(move || {
            let mut tasks = Vec::with_capacity(requests.len());
            for request in requests {
                let due = start + request.due;
                sleep_until(due);
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
) -> Option<Held> {
    let started = Instant::now();
    let held = tokio::time::timeout(BUDGET, client.acquire(key))
        .await
        .ok()?
        .ok()?;
    let acquired = Instant::now();
    let _: Option<String> = redis::cmd("GET").arg(key).query_async(data).await.ok()?;
    let releasing = Instant::now();
    client.release(held).await.ok()?;
    Some(Held {
        started,
        acquired,
        releasing,
        released: Instant::now(),
    })
}

/// Sleeps until `due` (at once if it has passed).
fn sleep_until(due: Instant) {
    let now = Instant::now();
    if due > now {
        std::thread::sleep(due - now);
    }
}

/// rslock's (or any client's) closed-loop capacity for the open loop's request: `tasks` tasks,
/// each acquiring a key of its own, reading it, releasing, and again, for `duration`; requests
/// per second.
pub(crate) async fn capacity(
    client: &Arc<Client>,
    data: &redis::aio::MultiplexedConnection,
    tasks: usize,
    duration: Duration,
    tag: &str,
) -> Result<f64, String> {
    client.warm_up(tag).await?;
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration;
    let (data, tag) = (data.clone(), tag.to_owned());
    let per_worker = run_workers(client, tasks, move |worker, client| {
        let (mut data, tag) = (data.clone(), tag.clone());
        async move {
            tokio::time::sleep_until(start.into()).await;
            let mut done = 0u64;
            while Instant::now() < deadline {
                let key = format!("open-capacity:{tag}:{worker}:{done}");
                one(&client, &mut data, &key)
                    .await
                    .ok_or("a request of the capacity run failed")?;
                done += 1;
            }
            Ok::<_, String>(done)
        }
    })
    .await;
    let requests: u64 = per_worker.into_iter().sum::<Result<u64, String>>()?;
    Ok(requests as f64 / start.elapsed().as_secs_f64())
}

/// Achieved rate, latency percentiles, timeouts and overlapping holds of one measurement.
fn summarize(mut done: Vec<Done>, elapsed: Duration) -> Map<String, serde_json::Value> {
    let held: Vec<(u64, Held)> = done
        .iter()
        .filter_map(|d| d.held.map(|held| (d.latency_ns, held)))
        .collect();
    let timeouts = done.len() - held.len();
    let p50 = |part: &dyn Fn(&(u64, Held)) -> u64| {
        let mut sorted: Vec<u64> = held.iter().map(part).collect();
        sorted.sort_unstable();
        us(quantile(&sorted, 0.50))
    };
    let nanos = |from: Instant, to: Instant| (to - from).as_nanos() as u64;
    let mut sorted: Vec<u64> = held.iter().map(|(latency, _)| *latency).collect();
    sorted.sort_unstable();
    // Holds of one key that overlap in time: two holders at once.
    done.sort_by_key(|d| (d.key, d.held.map(|held| held.acquired)));
    let violations = done
        .windows(2)
        .filter(|pair| pair[0].key == pair[1].key)
        .filter(|pair| match (pair[0].held, pair[1].held) {
            (Some(first), Some(second)) => second.acquired < first.releasing,
            _ => false,
        })
        .count();
    let mut result = Map::new();
    result.insert("requests".into(), done.len().into());
    result.insert(
        "achieved_per_s".into(),
        (held.len() as f64 / elapsed.as_secs_f64()).into(),
    );
    if !sorted.is_empty() {
        result.insert("p50_us".into(), us(quantile(&sorted, 0.50)).into());
        result.insert("p99_us".into(), us(quantile(&sorted, 0.99)).into());
        result.insert("p999_us".into(), us(quantile(&sorted, 0.999)).into());
        // Where a request's time goes (medians of each part): from its due time until its
        // task ran, acquiring, the GET, releasing.
        let due = |(latency, held): &(u64, Held)| {
            latency.saturating_sub(nanos(held.started, held.released))
        };
        result.insert("start_p50_us".into(), p50(&due).into());
        let acquire = |(_, held): &(u64, Held)| nanos(held.started, held.acquired);
        result.insert("acquire_p50_us".into(), p50(&acquire).into());
        let get = |(_, held): &(u64, Held)| nanos(held.acquired, held.releasing);
        result.insert("get_p50_us".into(), p50(&get).into());
        let release = |(_, held): &(u64, Held)| nanos(held.releasing, held.released);
        result.insert("release_p50_us".into(), p50(&release).into());
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
