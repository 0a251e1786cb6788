//! Workload 6: Redlock over several masters — distlock's Redlock engine beside rslock's and
//! redlock's multi-server modes, on the same masters, in one run: a sequential cycle and one key
//! contended by several tasks. Ratios are to rslock in the same repetition; there is no floor
//! (a quorum round trip is the slowest of several servers').

use crate::clients::{Client, LibId};
use crate::measure::{quantile, us};
use crate::run::Outcome;
use crate::workloads::contended::{analyze, contend};
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One repetition: every library, sequential then contended, in the same order.
pub(crate) async fn run(
    libs: &[LibId],
    urls: &[String],
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
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
        sequential.push((lib, cycles(&client, duration, &tag).await));
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
