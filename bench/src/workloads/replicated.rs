//! Workload 7: a primary with one replica — distlock with every grant and renewal acknowledged
//! by the replica (`min_replicas(1)`: the script and `WAIT 1` in one round trip) beside the
//! peers, which do not wait for replicas (a failover can lose their locks), on the same servers,
//! in one run: a sequential cycle. The distlock row also carries the same cycle without
//! acknowledgement, so the price of `WAIT` reads directly.

use crate::clients::{Client, LibId};
use crate::workloads::redlock::{cycles, relate_to_rslock};
use distlock::Backend;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// One repetition: every library in the same order; distlock twice, with and without `WAIT`.
pub(crate) async fn run(
    libs: &[LibId],
    primary_url: &str,
    duration: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, super::Outcome)>)> {
    let mut rows = Vec::new();
    for &lib in libs {
        if lib == LibId::DistlockFixed {
            continue;
        }
        let tag = format!("replicated-{}-{rep}", lib.name());
        let outcome = match lib {
            LibId::Distlock => distlock_rows(primary_url, duration, &tag).await,
            _ => match warm(Client::connect(lib, primary_url), &tag).await {
                Ok(client) => cycles(&client, duration, &tag).await,
                Err(reason) => Err(reason),
            },
        };
        rows.push((lib, outcome));
    }
    relate_to_rslock(&mut rows, "cycles_per_s");
    vec![("replicated", rows)]
}

/// distlock acknowledged, with the unacknowledged cycle's numbers beside (`unacked_*`) and the
/// difference in median latency (`wait_cost_p50_us`).
async fn distlock_rows(url: &str, duration: Duration, tag: &str) -> super::Outcome {
    let acked = Backend::builder(url)
        .prefix("bench")
        .min_replicas(1)
        .build()
        .map_err(|err| format!("distlock backend: {err}"))?;
    let acked = warm(Ok(Client::distlock(acked)), tag).await?;
    let unacked = warm(Client::connect(LibId::Distlock, url), tag).await?;
    let plain = cycles(&unacked, duration / 2, &format!("{tag}-unacked")).await?;
    let mut result = cycles(&acked, duration / 2, tag).await?;
    for (from, to) in [
        ("cycles_per_s", "unacked_cycles_per_s"),
        ("p50_us", "unacked_p50_us"),
    ] {
        if let Some(value) = plain.get(from).cloned() {
            result.insert(to.into(), value);
        }
    }
    let p50 = |result: &serde_json::Map<String, Value>, key: &str| {
        result.get(key).and_then(Value::as_f64)
    };
    if let (Some(acked), Some(unacked)) = (p50(&result, "p50_us"), p50(&plain, "p50_us")) {
        result.insert("wait_cost_p50_us".into(), (acked - unacked).into());
    }
    Ok(result)
}

async fn warm(client: Result<Client, String>, tag: &str) -> Result<Arc<Client>, String> {
    let client = Arc::new(client?);
    client.warm_up(tag).await?;
    Ok(client)
}
