//! Workloads 1 and 2: acquire + release of distinct keys, by one task (sequential) or by many
//! tasks at once over the library's normal connection handling (parallel).

use super::START_DELAY;
use crate::calibrate::Origins;
use crate::clients::{run_workers, Client};
use crate::measure::{process_cpu, quantile, us};
use crate::server_stats::{self, Window};
use distlock_test_support::RedisServer;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// `tasks` workers cycle through fresh keys for `duration`: cycles/s, cycle latency, and what
/// the server did per cycle.
pub(crate) async fn run(
    server: &RedisServer,
    client: &Arc<Client>,
    origins: &Origins,
    tasks: usize,
    duration: Duration,
    tag: &str,
) -> Result<Map<String, Value>, String> {
    server_stats::flush(server);
    client.warm_up(tag).await?;
    let window = Window::open(server);
    let cpu_before = process_cpu();
    let start = Instant::now() + START_DELAY;
    let deadline = start + duration;
    let tag = tag.to_owned();
    let per_worker = run_workers(client, tasks, move |worker, client| {
        let tag = tag.clone();
        async move {
            tokio::time::sleep_until(start.into()).await;
            let mut latencies = Vec::with_capacity(1 << 14);
            let mut last_end = start;
            while Instant::now() < deadline {
                let key = format!("free:{tag}:{worker}:{}", latencies.len());
                let began = Instant::now();
                let held = client.acquire(&key).await?;
                client.release(held).await?;
                last_end = Instant::now();
                latencies.push((last_end - began).as_nanos() as u64);
            }
            Ok::<_, String>((latencies, last_end))
        }
    })
    .await;
    let client_cpu = process_cpu().saturating_sub(cpu_before);
    let delta = window.close(server);

    let mut latencies = Vec::new();
    let mut end = start;
    for result in per_worker {
        let (worker_latencies, worker_end) = result?;
        latencies.extend(worker_latencies);
        end = end.max(worker_end);
    }
    latencies.sort_unstable();
    let cycles = latencies.len() as u64;
    if cycles == 0 {
        return Err("no cycle completed".into());
    }
    let elapsed = (end - start).as_secs_f64();
    let per_cycle = |total: f64| total / cycles as f64;

    let mut result = Map::new();
    result.insert("tasks".into(), tasks.into());
    result.insert("cycles".into(), cycles.into());
    result.insert("cycles_per_s".into(), (cycles as f64 / elapsed).into());
    result.insert("p50_us".into(), us(quantile(&latencies, 0.50)).into());
    result.insert("p99_us".into(), us(quantile(&latencies, 0.99)).into());
    result.insert("max_us".into(), us(quantile(&latencies, 1.0)).into());
    delta.record_costs(&mut result, origins, cycles, "cycle", Some(client_cpu));
    result.insert(
        "script_calls_per_cycle".into(),
        per_cycle(delta.script_calls() as f64).into(),
    );
    Ok(result)
}
