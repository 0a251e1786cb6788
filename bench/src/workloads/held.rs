//! Workload 4: many leases held at once, kept alive by the library: renewal script calls,
//! Redis CPU and client CPU per renewal period, and the tasks the library needs for it.
//!
//! Both libraries get the same lease TTL. distlock renews every TTL/3 from one watchdog task per
//! backend, in batches; rslock's `using` runs one timer per lock and extends each lock 500 ms
//! before its validity ends. Each is measured over whole periods of its own.

use crate::measure::process_cpu;
use crate::server_stats::{self, Delta, Window};
use distlock::{Backend, Lease, Lock, LockGuard};
use distlock_test_support::RedisServer;
use serde_json::{Map, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// distlock's default renewal batch, set explicitly so the bound below is the one in force.
pub(crate) const RENEW_BATCH: usize = 256;
/// Concurrent acquisitions while taking the leases.
const ACQUIRERS: usize = 64;
/// Longest the leases may take to be acquired.
const ACQUIRE_DEADLINE: Duration = Duration::from_secs(120);

/// Reason the peer that cannot hold a lease beyond its TTL gets no row.
pub(crate) const REDLOCK_NA: &str =
    "redlock 2.0.0 has no way to extend a lock (lock/unlock only): a lease cannot outlive its TTL";

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// `leases` watchdog leases on one backend, held through `periods` renewal periods.
pub(crate) async fn distlock(
    server: &RedisServer,
    leases: usize,
    ttl: Duration,
    periods: u32,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    let backend = Backend::builder(server.url())
        .prefix("bench-held")
        .watchdog_lease(ttl)
        .renew_batch(RENEW_BATCH)
        .build()
        .map_err(|e| e.to_string())?;
    let tasks_before = alive_tasks();
    let started = Instant::now();
    let acquirers: Vec<_> = (0..ACQUIRERS)
        .map(|a| {
            let backend = backend.clone();
            tokio::spawn(async move {
                let mut guards = Vec::new();
                for i in (a..leases).step_by(ACQUIRERS) {
                    let guard = Lock::new(format!("held:{i}"))
                        .on(&backend)
                        .lease(Lease::Watchdog)
                        .acquire()
                        .await
                        .map_err(|e| e.to_string())?;
                    guards.push(guard);
                }
                Ok::<_, String>(guards)
            })
        })
        .collect();
    let mut guards: Vec<LockGuard> = Vec::with_capacity(leases);
    for acquirer in acquirers {
        guards.extend(acquirer.await.map_err(|e| e.to_string())??);
    }
    let acquire_s = started.elapsed().as_secs_f64();
    let background_tasks = alive_tasks().saturating_sub(tasks_before);

    // Leases acquired over a stretch of time are brought into one renewal phase by the
    // watchdog within a period or two; measure the steady state after that.
    let period = ttl / 3;
    tokio::time::sleep(period * 2).await;
    let stats_before = backend.stats();
    let Measured {
        elapsed,
        client_cpu,
        delta,
    } = measure_idle(server, period * periods).await;
    let stats = backend.stats();
    let still_held = guards.iter().filter(|g| g.is_held()).count();
    let probe = cycles_while_held(period, || async {
        let guard = Lock::new("held:probe")
            .on(&backend)
            .lease(Lease::Watchdog)
            .acquire()
            .await
            .map_err(|e| e.to_string())?;
        guard.release().await.map(drop).map_err(|e| e.to_string())
    })
    .await?;

    let releasers: Vec<_> = chunks(guards, ACQUIRERS)
        .into_iter()
        .map(|chunk| {
            tokio::spawn(async move {
                for guard in chunk {
                    guard.release().await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(())
            })
        })
        .collect();
    for releaser in releasers {
        releaser.await.map_err(|e| e.to_string())??;
    }

    let measured_periods = elapsed.as_secs_f64() / period.as_secs_f64();
    let per_period = |total: f64| total / measured_periods;
    let mut result = Map::new();
    result.insert("leases".into(), leases.into());
    result.insert("ttl_ms".into(), (ttl.as_millis() as u64).into());
    result.insert("period_ms".into(), (period.as_millis() as u64).into());
    result.insert("acquire_s".into(), acquire_s.into());
    result.insert(
        "renewal_calls_per_period".into(),
        per_period((stats.renewal_calls - stats_before.renewal_calls) as f64).into(),
    );
    result.insert(
        "script_calls_per_period".into(),
        per_period(delta.script_calls() as f64).into(),
    );
    result.insert(
        "leases_renewed_per_period".into(),
        per_period((stats.renewed - stats_before.renewed) as f64).into(),
    );
    result.insert(
        "renewal_call_bound".into(),
        leases.div_ceil(RENEW_BATCH).into(),
    );
    add_cpu(&mut result, per_period, delta.cpu, client_cpu, elapsed);
    result.insert("background_tasks".into(), background_tasks.into());
    result.insert(
        "tasks_per_lease".into(),
        (background_tasks as f64 / leases as f64).into(),
    );
    result.insert("lost".into(), (stats.lost - stats_before.lost).into());
    result.insert("not_held_at_end".into(), (leases - still_held).into());
    add_probe(&mut result, probe);
    result.insert(
        "commands_per_period".into(),
        scale(delta.per_unit(1), 1.0 / measured_periods).into(),
    );
    Ok(result)
}

/// `leases` concurrent `LockManager::using` calls, each extending its own lock.
pub(crate) async fn rslock(
    server: &RedisServer,
    leases: usize,
    ttl: Duration,
    periods: u32,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    let manager = rslock::LockManager::new(vec![server.url()]);
    let tasks_before = alive_tasks();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let holding = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let holders: Vec<_> = (0..leases)
        .map(|i| {
            let (manager, holding, mut stopped) =
                (manager.clone(), holding.clone(), stopped.clone());
            tokio::spawn(async move {
                let key = format!("rslock:held:{i}").into_bytes();
                manager
                    .using(&key, ttl, async move || {
                        holding.fetch_add(1, Ordering::Relaxed);
                        let _ = stopped.wait_for(|stop| *stop).await;
                    })
                    .await
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    while holding.load(Ordering::Relaxed) < leases {
        if started.elapsed() > ACQUIRE_DEADLINE {
            return Err(format!(
                "only {} of {leases} leases acquired in {ACQUIRE_DEADLINE:?}",
                holding.load(Ordering::Relaxed)
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let acquire_s = started.elapsed().as_secs_f64();
    let background_tasks = alive_tasks().saturating_sub(tasks_before);

    // rslock's `using` extends when the lock's validity (TTL minus 1 % + 2 ms of drift, minus
    // the acquisition time) has 500 ms left.
    let drift = ttl.mul_f64(0.01) + Duration::from_millis(2);
    let period = ttl.saturating_sub(drift + Duration::from_millis(500));
    tokio::time::sleep(period / 2).await;
    let Measured {
        elapsed,
        client_cpu,
        delta,
    } = measure_idle(server, period * periods).await;
    let probe = cycles_while_held(period, || async {
        let guard = manager
            .acquire(b"rslock:held:probe", crate::clients::FIXED_TTL)
            .await
            .map_err(|e| e.to_string())?;
        guard.release().await;
        Ok(())
    })
    .await?;

    let _ = stop.send(true);
    let mut failed = 0usize;
    for holder in holders {
        if !matches!(holder.await, Ok(Ok(()))) {
            failed += 1;
        }
    }

    let measured_periods = elapsed.as_secs_f64() / period.as_secs_f64();
    let per_period = |total: f64| total / measured_periods;
    let extends = delta.script_calls() as f64;
    let mut result = Map::new();
    result.insert("leases".into(), leases.into());
    result.insert("ttl_ms".into(), (ttl.as_millis() as u64).into());
    result.insert("period_ms".into(), (period.as_millis() as u64).into());
    result.insert("acquire_s".into(), acquire_s.into());
    result.insert(
        "renewal_calls_per_period".into(),
        per_period(extends).into(),
    );
    result.insert("script_calls_per_period".into(), per_period(extends).into());
    result.insert(
        "leases_renewed_per_period".into(),
        per_period(extends).into(),
    );
    add_cpu(&mut result, per_period, delta.cpu, client_cpu, elapsed);
    result.insert("background_tasks".into(), background_tasks.into());
    result.insert(
        "tasks_per_lease".into(),
        (background_tasks as f64 / leases as f64).into(),
    );
    result.insert("lost".into(), failed.into());
    add_probe(&mut result, probe);
    result.insert(
        "commands_per_period".into(),
        scale(delta.per_unit(1), 1.0 / measured_periods).into(),
    );
    Ok(result)
}

/// What the server and this process spent while the leases were only held, for `span`.
struct Measured {
    elapsed: Duration,
    client_cpu: Duration,
    delta: Delta,
}

async fn measure_idle(server: &RedisServer, span: Duration) -> Measured {
    let window = Window::open(server);
    let cpu_before = process_cpu();
    let started = Instant::now();
    tokio::time::sleep(span).await;
    let elapsed = started.elapsed();
    let client_cpu = process_cpu().saturating_sub(cpu_before);
    Measured {
        elapsed,
        client_cpu,
        delta: window.close(server),
    }
}

/// What holding the leases costs every other lock operation of the client: sequential
/// acquire + release cycles of one more key, for half a renewal period, while they are held.
async fn cycles_while_held<F, Fut>(period: Duration, mut cycle: F) -> Result<(f64, f64), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let cpu_before = process_cpu();
    let started = Instant::now();
    let mut cycles = 0u64;
    while started.elapsed() < period / 2 || cycles == 0 {
        cycle().await?;
        cycles += 1;
    }
    let cpu = process_cpu().saturating_sub(cpu_before);
    Ok((
        cycles as f64 / started.elapsed().as_secs_f64(),
        cpu.as_secs_f64() * 1e6 / cycles as f64,
    ))
}

fn add_probe(result: &mut Map<String, Value>, (cycles_per_s, cpu_us): (f64, f64)) {
    result.insert("cycles_per_s_while_held".into(), cycles_per_s.into());
    result.insert("client_cpu_us_per_cycle_while_held".into(), cpu_us.into());
}

fn add_cpu(
    result: &mut Map<String, Value>,
    per_period: impl Fn(f64) -> f64,
    redis_cpu: Duration,
    client_cpu: Duration,
    elapsed: Duration,
) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    result.insert(
        "redis_cpu_ms_per_period".into(),
        per_period(ms(redis_cpu)).into(),
    );
    result.insert(
        "client_cpu_ms_per_period".into(),
        per_period(ms(client_cpu)).into(),
    );
    let per_s = |d: Duration| ms(d) / elapsed.as_secs_f64();
    result.insert("redis_cpu_ms_per_s".into(), per_s(redis_cpu).into());
    result.insert("client_cpu_ms_per_s".into(), per_s(client_cpu).into());
}

fn scale(map: Map<String, Value>, factor: f64) -> Map<String, Value> {
    map.into_iter()
        .map(|(name, value)| {
            let scaled = value.as_f64().map_or(Value::Null, |v| (v * factor).into());
            (name, scaled)
        })
        .collect()
}

fn chunks<T>(items: Vec<T>, n: usize) -> Vec<Vec<T>> {
    let mut chunks: Vec<Vec<T>> = (0..n).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        chunks[i % n].push(item);
    }
    chunks
}
