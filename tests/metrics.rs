//! The `metrics` feature, scraped: a known workload on the in-process backend and on a real
//! redis-server, rendered by the Prometheus exporter in its text format, must show exactly the
//! counts the workload produced — labelled by backend name and key template, never by a
//! rendered key — with every gauge back at zero at the end.
//!
//! The recorder is global, so this binary holds one test: another test running beside it would
//! add to the counts.

mod common;

use common::PREFIX;
use distlock::{distributed_lock, Backend, Lease, Lock, LockError, LostReason, Registry};
use distlock_test_support::RedisServer;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// The in-process backend's registry name.
const METERED: &str = "metered";
/// The redis-server backend's registry name.
const REDIS: &str = "redis";

#[distributed_lock(key = "order:<id>", backend = "metered")]
async fn ship(id: u32) -> Result<u32, LockError> {
    Ok(id)
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], backend = "metered")]
async fn transfer(from: u32, to: u32) -> Result<(), LockError> {
    assert_ne!(from, to);
    Ok(())
}

/// One sample of a scrape: metric name, labels, value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape in the text exposition format, parsed.
struct Scrape {
    text: String,
    samples: Vec<Sample>,
}

impl Scrape {
    fn of(handle: &PrometheusHandle) -> Scrape {
        let text = handle.render();
        let samples = text
            .lines()
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(sample)
            .collect();
        Scrape { text, samples }
    }

    /// The value of the series with exactly these labels; `None` when there is none.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let wanted: BTreeMap<String, String> = labels
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .collect();
        let mut found = self
            .samples
            .iter()
            .filter(|sample| sample.name == name && sample.labels == wanted);
        let value = found.next().map(|sample| sample.value);
        assert!(found.next().is_none(), "{name} {labels:?} appears twice");
        value
    }

    /// The value of a series that must exist.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels)
            .unwrap_or_else(|| panic!("no series {name} {labels:?} in the scrape:\n{}", self.text))
    }

    /// Every series of `name` carrying these labels (and maybe others).
    fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |sample| {
            sample.name == name
                && labels
                    .iter()
                    .all(|(key, value)| sample.labels.get(*key).map(String::as_str) == Some(value))
        })
    }
}

/// `name{key="value",…} number`; label values may hold `,` and escaped `"`.
fn sample(line: &str) -> Sample {
    let (series, value) = line.rsplit_once(' ').expect("series and value");
    let value = value.parse().expect("a number");
    let Some((name, rest)) = series.split_once('{') else {
        return Sample {
            name: series.to_owned(),
            labels: BTreeMap::new(),
            value,
        };
    };
    let mut labels = BTreeMap::new();
    let mut chars = rest.strip_suffix('}').expect("closing brace").chars();
    loop {
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() {
            break;
        }
        assert_eq!(chars.next(), Some('"'), "{line}");
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => value.push(chars.next().expect("escaped character")),
                '"' => break,
                c => value.push(c),
            }
        }
        labels.insert(key.trim_start_matches(',').to_owned(), value);
    }
    Sample {
        name: name.to_owned(),
        labels,
        value,
    }
}

/// Told of every update of every metric, by the recorder the test installs ([`Notifying`]).
static RECORDED: Notify = Notify::const_new();

/// The Prometheus recorder, telling [`RECORDED`] of every update after making it.
struct Notifying<R>(R);

impl<R: Recorder> Recorder for Notifying<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_counter(key, unit, description)
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_gauge(key, unit, description)
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.0.describe_histogram(key, unit, description)
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        Counter::from_arc(Arc::new(Notifying(self.0.register_counter(key, metadata))))
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(Arc::new(Notifying(self.0.register_gauge(key, metadata))))
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(Arc::new(Notifying(
            self.0.register_histogram(key, metadata),
        )))
    }
}

impl CounterFn for Notifying<Counter> {
    fn increment(&self, value: u64) {
        self.0.increment(value);
        RECORDED.notify_one();
    }

    fn absolute(&self, value: u64) {
        self.0.absolute(value);
        RECORDED.notify_one();
    }
}

impl GaugeFn for Notifying<Gauge> {
    fn increment(&self, value: f64) {
        self.0.increment(value);
        RECORDED.notify_one();
    }

    fn decrement(&self, value: f64) {
        self.0.decrement(value);
        RECORDED.notify_one();
    }

    fn set(&self, value: f64) {
        self.0.set(value);
        RECORDED.notify_one();
    }
}

impl HistogramFn for Notifying<Histogram> {
    fn record(&self, value: f64) {
        self.0.record(value);
        RECORDED.notify_one();
    }
}

/// Waits up to five seconds until `done` holds: checked now, then after every metric update (an
/// update made while it was checking leaves a permit, so none is missed). `false` if it never did.
async fn until_recorded(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if done() {
            return true;
        }
        // Updates may keep coming; the deadline holds all the same.
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        if tokio::time::timeout_at(deadline, RECORDED.notified())
            .await
            .is_err()
        {
            return done();
        }
    }
}

/// Renders until `done` holds for the scrape, for at most five seconds: again after every update.
async fn scrape_until(handle: &PrometheusHandle, what: &str, done: impl Fn(&Scrape) -> bool) {
    let mut scrape = Scrape::of(handle);
    let seen = until_recorded(|| {
        scrape = Scrape::of(handle);
        done(&scrape)
    })
    .await;
    assert!(
        seen,
        "{what}: not seen within 5s; last scrape:\n{}",
        scrape.text
    );
}

async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(5), future)
        .await
        .unwrap_or_else(|_| panic!("{what}: not within 5s"))
}

#[test]
fn a_known_workload_scrapes_to_exactly_its_counts() {
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &[0.001, 0.1, 10.0])
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(Notifying(recorder)).expect("the only recorder of this binary");
    distlock::describe_metrics();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    let (metered, redis) = runtime.block_on(async {
        let metered = Backend::in_process();
        Registry::global()
            .register(METERED, metered.clone())
            .unwrap();
        let redis = Backend::builder(server.url())
            .prefix(PREFIX)
            .watchdog_lease(Duration::from_millis(900))
            .build()
            .unwrap();
        Registry::global().register(REDIS, redis.clone()).unwrap();
        workload(&handle, &server).await;
        (metered, redis)
    });

    let scrape = Scrape::of(&handle);
    let order = [("backend", METERED), ("lock", "order:<id>")];
    let accounts = [
        ("backend", METERED),
        ("lock", "account:<from>,account:<to>"),
    ];
    let invoice = [("backend", METERED), ("lock", "invoice:<n>")];
    let blob = [("backend", METERED), ("lock", "blob:<hash>")];
    let session = [("backend", REDIS), ("lock", "session:<user>")];
    let with = |labels: &[(&'static str, &'static str)], key, value| {
        let mut labels = labels.to_vec();
        labels.push((key, value));
        labels
    };

    // Acquisitions by outcome: one per lock, whatever its number of keys.
    let acquisitions = "distlock_acquisitions_total";
    let expected_acquisitions = [
        (with(&order, "outcome", "acquired"), 7.0),
        (with(&order, "outcome", "busy"), 2.0),
        (with(&accounts, "outcome", "acquired"), 1.0),
        (with(&invoice, "outcome", "acquired"), 2.0),
        (with(&blob, "outcome", "error"), 1.0),
        (with(&session, "outcome", "acquired"), 1.0),
    ];
    for (labels, count) in &expected_acquisitions {
        assert_eq!(scrape.value(acquisitions, labels), *count, "{labels:?}");
    }
    assert_eq!(
        scrape.matching(acquisitions, &[]).count(),
        expected_acquisitions.len(),
        "no other acquisition series:\n{}",
        scrape.text
    );

    // Wait and hold histograms: one observation per acquired lock, none for the failed ones.
    for (labels, count) in [
        (&order[..], 7.0),
        (&accounts, 1.0),
        (&invoice, 2.0),
        (&session, 1.0),
    ] {
        for histogram in ["distlock_wait_seconds", "distlock_hold_seconds"] {
            let name = format!("{histogram}_count");
            assert_eq!(scrape.value(&name, labels), count, "{name} {labels:?}");
            let all = with(labels, "le", "+Inf");
            assert_eq!(scrape.value(&format!("{histogram}_bucket"), &all), count);
        }
    }
    assert_eq!(scrape.get("distlock_wait_seconds_count", &blob), None);
    // The waiter queued behind `order:7` until its holder let go.
    assert!(scrape.value("distlock_wait_seconds_sum", &order) > 0.0);

    // Lost leases by reason: the fixed lease that ran out, the Redis key deleted under its owner.
    let lost = "distlock_leases_lost_total";
    assert_eq!(
        scrape.value(lost, &with(&invoice, "reason", "expired")),
        1.0
    );
    assert_eq!(scrape.value(lost, &with(&session, "reason", "gone")), 1.0);
    assert_eq!(scrape.matching(lost, &[]).count(), 2, "{}", scrape.text);

    // Releases by what they found: one per key.
    let releases = "distlock_releases_total";
    let expected_releases = [
        (with(&order, "outcome", "released"), 7.0),
        (with(&accounts, "outcome", "released"), 2.0),
        (with(&invoice, "outcome", "released"), 1.0),
        (with(&invoice, "outcome", "taken_over"), 1.0),
        (with(&session, "outcome", "expired"), 1.0),
    ];
    for (labels, count) in &expected_releases {
        assert_eq!(scrape.value(releases, labels), *count, "{labels:?}");
    }
    assert_eq!(
        scrape.matching(releases, &[]).count(),
        expected_releases.len(),
        "{}",
        scrape.text
    );

    // Renewals: the same number the backends' own counters saw, at least two for the session.
    for (backend, name) in [(&metered, METERED), (&redis, REDIS)] {
        let renewals: f64 = scrape
            .matching("distlock_renewals_total", &[("backend", name)])
            .map(|sample| sample.value)
            .sum();
        assert_eq!(renewals, backend.stats().renewed as f64, "{name}");
    }
    assert!(scrape.value("distlock_renewals_total", &session) >= 2.0);

    // Gauges: back to zero on every path (release, the end of a call, a busy or failed try).
    for gauge in ["distlock_leases_held", "distlock_tasks_waiting"] {
        let series: Vec<&Sample> = scrape.matching(gauge, &[]).collect();
        assert!(!series.is_empty(), "{gauge} was never set");
        for sample in series {
            assert_eq!(sample.value, 0.0, "{gauge} {:?}", sample.labels);
        }
    }

    // Help and type lines, from `describe_metrics` and the buckets set above.
    for line in [
        "# TYPE distlock_acquisitions_total counter",
        "# TYPE distlock_wait_seconds histogram",
        "# TYPE distlock_hold_seconds histogram",
        "# TYPE distlock_leases_held gauge",
        "# TYPE distlock_tasks_waiting gauge",
        "# HELP distlock_releases_total ",
    ] {
        assert!(
            scrape.text.contains(line),
            "missing {line:?}:\n{}",
            scrape.text
        );
    }

    // Labels are templates: no rendered key is anywhere in the scrape.
    for key in [
        "order:1",
        "order:7",
        "account:1",
        "account:2",
        "invoice:9",
        "session:42",
        "blob:f",
    ] {
        assert!(
            !scrape.text.contains(key),
            "the rendered key {key} is in the scrape:\n{}",
            scrape.text
        );
    }
    drop(server);
}

/// The counts the assertions above expect, step by step.
async fn workload(handle: &PrometheusHandle, server: &RedisServer) {
    let order = |id: u32| {
        Lock::new(format!("order:{id}"))
            .template("order:<id>")
            .backend(METERED)
    };
    let held = |scrape: &Scrape, gauge: &str| {
        scrape.get(gauge, &[("backend", METERED), ("lock", "order:<id>")])
    };

    // order:<id> — 5 acquired, released.
    for id in 1..=5 {
        assert_eq!(ship(id).await.unwrap(), id);
    }

    // order:<id> — 1 acquired by hand; 2 busy calls while it is held.
    let holder = order(7).acquire().await.unwrap();
    assert_eq!(held(&Scrape::of(handle), "distlock_leases_held"), Some(1.0));
    for _ in 0..2 {
        assert!(ship(7).await.unwrap_err().is_busy());
    }

    // order:<id> — a waiter queues behind the holder (the gauge shows it), and gets the lock
    // once the holder releases: 2 more acquired and released.
    let waiter = tokio::spawn(async move {
        let guard = order(7).wait(Duration::from_secs(10)).acquire().await?;
        guard.release().await
    });
    scrape_until(handle, "a task waiting for order:7", |scrape| {
        held(scrape, "distlock_tasks_waiting") == Some(1.0)
    })
    .await;
    holder.release().await.unwrap();
    within("the waiter", waiter).await.unwrap().unwrap();

    // account:<from>,account:<to> — one lock, two keys.
    transfer(1, 2).await.unwrap();

    // invoice:<n> — a fixed lease runs out (lost: expired); another call takes the key, so the
    // first one's release finds it taken over; the second releases normally.
    let invoice = || {
        Lock::new("invoice:9")
            .template("invoice:<n>")
            .backend(METERED)
    };
    let first = invoice()
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    let lost = within("the fixed lease's end", first.lost()).await;
    assert!(
        matches!(
            lost,
            LockError::Lost {
                reason: LostReason::Expired,
                ..
            }
        ),
        "{lost:?}"
    );
    let second = invoice()
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert_eq!(
        first.release().await.unwrap(),
        distlock::Released::TakenOver
    );
    assert_eq!(
        second.release().await.unwrap(),
        distlock::Released::Released
    );

    // blob:<hash> — an error before the server is asked: the key is too long.
    let blob = Lock::new(format!("blob:{}", "f".repeat(600)))
        .template("blob:<hash>")
        .backend(METERED)
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(blob, LockError::InvalidKey { .. }), "{blob:?}");

    // session:<user> on Redis — renewed twice, then the key is deleted under its owner: the next
    // renewal reports it gone, and the release finds it expired.
    let session = Lock::new("session:42")
        .template("session:<user>")
        .backend(REDIS)
        .acquire()
        .await
        .unwrap();
    let redis = Registry::global().get(REDIS).unwrap();
    // A renewal is counted in the stats, then in the metrics: each update wakes the check.
    assert!(
        until_recorded(|| redis.stats().renewed >= 2).await,
        "two renewals: not within 5s: {:?}",
        redis.stats()
    );
    let key = format!("{PREFIX}:{{session:42}}");
    assert_eq!(
        server.command(&["DEL", &key]),
        distlock_test_support::Reply::Int(1)
    );
    let lost = within("the renewal that finds the key gone", session.lost()).await;
    assert!(
        matches!(
            lost,
            LockError::Lost {
                reason: LostReason::Gone,
                ..
            }
        ),
        "{lost:?}"
    );
    assert_eq!(
        session.release().await.unwrap(),
        distlock::Released::Expired
    );
}
