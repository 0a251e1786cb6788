//! Workload 6: Redlock over several masters — distlock's Redlock engine beside rslock's and
//! redlock's multi-server modes, on the same masters, in one run: a sequential cycle and one key
//! contended by several tasks. Ratios are to rslock in the same repetition; there is no floor
//! (a quorum round trip is the slowest of several servers'). The sequential phase also records
//! what a cycle costs on all masters together (commands, script execution, CPU) and in the
//! client: with the masters and the client sharing the machine's cores, CPU per cycle is what
//! bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::process_cpu;
use crate::measure::{quantile, us};
use crate::server_stats::{is_script_call, Delta, Window};
use crate::workloads::contended::{analyze, contend};
use distlock_test_support::RedisServer;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One repetition: every library, sequential then contended, in the same order.
pub(crate) async fn run(
    libs: &[LibId],
    servers: &[RedisServer],
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let masters = urls.join(",");
    let mut sequential = Vec::new();
    let mut contended = Vec::new();
    for &lib in libs {
        let tag = format!("redlock-{}-{rep}", lib.name());
        let client = match connect_warm(lib, &masters, &tag).await {
            Ok(client) => client,
            Err(reason) => {
                sequential.push((lib, Err(reason.clone())));
                contended.push((lib, Err(reason)));
                continue;
            }
        };
        let windows: Vec<Window> = servers.iter().map(Window::open).collect();
        let cpu_before = process_cpu();
        let mut outcome = cycles(&client, duration, &tag).await;
        let client_cpu = process_cpu().saturating_sub(cpu_before);
        let deltas: Vec<Delta> = windows
            .into_iter()
            .zip(servers)
            .map(|(window, server)| window.close(server))
            .collect();
        if let Ok(result) = &mut outcome {
            record_costs(result, &deltas, client_cpu);
        }
        sequential.push((lib, outcome));
        let outcome = contend(
            &client,
            &format!("busy:{tag}"),
            contenders,
            0,
            duration,
            critical_section,
        )
        .await
        .and_then(|acquisitions| analyze(acquisitions, contenders, 1))
        .map(|mut result| {
            // Any acquire that ran out of its budget ends the phase with an error instead.
            result.insert("timeouts".into(), 0.into());
            result
        });
        contended.push((lib, outcome));
    }
    relate_to_rslock(&mut sequential, "cycles_per_s");
    relate_to_rslock(&mut contended, "cs_per_s");
    vec![
        ("redlock_sequential", sequential),
        ("redlock_contended", contended),
    ]
}

/// What the cycles of `result` cost, per cycle: commands on all masters (script-internal ones
/// included), script execution time, the masters' CPU, and the client process's CPU.
fn record_costs(result: &mut Map<String, Value>, deltas: &[Delta], client_cpu: Duration) {
    let cycles = result
        .get("cycles")
        .and_then(Value::as_u64)
        .unwrap_or(0)
        .max(1) as f64;
    let commands: u64 = deltas.iter().map(Delta::total).sum();
    let script_us: u64 = deltas
        .iter()
        .flat_map(|delta| &delta.usec)
        .filter(|(name, _)| is_script_call(name))
        .map(|(_, us)| us)
        .sum();
    let cpu: Duration = deltas.iter().map(|delta| delta.cpu).sum();
    let mut put = |name: &str, value: f64| {
        result.insert(name.into(), (value / cycles).into());
    };
    put("server_cmds_per_cycle", commands as f64);
    put("script_exec_us_per_cycle", script_us as f64);
    put("redis_cpu_us_per_cycle", cpu.as_secs_f64() * 1e6);
    put("client_cpu_us_per_cycle", client_cpu.as_secs_f64() * 1e6);
}

/// A client of `lib` on the masters, its connections opened and scripts loaded.
async fn connect_warm(lib: LibId, masters: &str, tag: &str) -> Result<Arc<Client>, String> {
    let client = Arc::new(Client::connect(lib, masters)?);
    client.warm_up(tag).await?;
    Ok(client)
}

/// One task, acquire + release of fresh keys for `duration`.
pub(crate) async fn cycles(client: &Arc<Client>, duration: Duration, tag: &str) -> Outcome {
    let start = Instant::now();
    let deadline = start + duration;
    let mut latencies = Vec::with_capacity(1 << 12);
    while Instant::now() < deadline {
        let key = format!("free:{tag}:{}", latencies.len());
        let began = Instant::now();
        let held = client.acquire(&key).await?;
        client.release(held).await?;
        latencies.push(began.elapsed().as_nanos() as u64);
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    if latencies.is_empty() {
        return Err("no cycle completed".into());
    }
    let mut result = Map::new();
    result.insert("cycles".into(), latencies.len().into());
    result.insert(
        "cycles_per_s".into(),
        (latencies.len() as f64 / elapsed).into(),
    );
    result.insert("p50_us".into(), us(quantile(&latencies, 0.50)).into());
    result.insert("p99_us".into(), us(quantile(&latencies, 0.99)).into());
    Ok(result)
}

/// Adds `ratio_to_rslock` of `key` to every row, against rslock's row of the same repetition.
pub(crate) fn relate_to_rslock(rows: &mut [(LibId, Outcome)], key: &str) {
    let rslock = rows
        .iter()
        .find(|(lib, _)| *lib == LibId::Rslock)
        .and_then(|(_, outcome)| outcome.as_ref().ok())
        .and_then(|result| result.get(key))
        .and_then(Value::as_f64);
    let Some(rslock) = rslock.filter(|rate| *rate > 0.0) else {
        return;
    };
    for (_, outcome) in rows.iter_mut() {
        if let Ok(result) = outcome {
            if let Some(rate) = result.get(key).and_then(Value::as_f64) {
                result.insert("ratio_to_rslock".into(), (rate / rslock).into());
            }
        }
    }
}
