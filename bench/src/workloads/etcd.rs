//! Workload 8: etcd — distlock's etcd engine beside etcd's own lock service (`Lock`/`Unlock`
//! through etcd-client, each lock bound to a session lease), on the same 3-member cluster, in
//! one run: a sequential cycle of distinct keys, and one key contended by several tasks (rate,
//! fairness, worst wait). Ratios are to etcd's lock service in the same repetition. The
//! sequential phase also records what a cycle costs in CPU, in this process and in the three
//! members together (`/proc`): on one shared CPU, that is what bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::{cpu_of, process_cpu};
use crate::workloads::contended::{analyze, contend};
use crate::workloads::redlock::cycles;
use distlock_test_support::EtcdCluster;
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The libraries of this workload: distlock on etcd, and etcd's lock service.
const LIBS: [LibId; 2] = [LibId::Distlock, LibId::EtcdLock];

/// One repetition: each library, sequential then contended, in the same order.
pub(crate) async fn run(
    cluster: &EtcdCluster,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let mut sequential = Vec::new();
    let mut contended = Vec::new();
    for lib in LIBS {
        let tag = format!("etcd-{}-{rep}", lib.name());
        let client = match connect_warm(lib, cluster, &tag).await {
            Ok(client) => client,
            Err(reason) => {
                sequential.push((lib, Err(reason.clone())));
                contended.push((lib, Err(reason)));
                continue;
            }
        };
        let members = cluster.pids();
        let cpu_of_members = || members.iter().map(|&pid| cpu_of(pid)).sum::<Duration>();
        let (client_before, members_before) = (process_cpu(), cpu_of_members());
        let mut outcome = cycles(&client, duration, &tag).await;
        let client_cpu = process_cpu().saturating_sub(client_before);
        let members_cpu = cpu_of_members().saturating_sub(members_before);
        if let Ok(result) = &mut outcome {
            let cycles = result.get("cycles").and_then(Value::as_f64).unwrap_or(1.0);
            let per_cycle = |cpu: Duration| cpu.as_secs_f64() * 1e6 / cycles.max(1.0);
            result.insert(
                "client_cpu_us_per_cycle".into(),
                per_cycle(client_cpu).into(),
            );
            result.insert(
                "etcd_cpu_us_per_cycle".into(),
                per_cycle(members_cpu).into(),
            );
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
        .and_then(|acquisitions| analyze(acquisitions, contenders, 1));
        contended.push((lib, outcome));
    }
    relate_to_etcd_lock(&mut sequential, "cycles_per_s");
    relate_to_etcd_lock(&mut contended, "cs_per_s");
    vec![
        ("etcd_sequential", sequential),
        ("etcd_contended", contended),
    ]
}

/// A client of `lib` on the cluster, connected, with a few cycles done.
async fn connect_warm(lib: LibId, cluster: &EtcdCluster, tag: &str) -> Result<Arc<Client>, String> {
    let client = match lib {
        LibId::EtcdLock => Client::etcd_lock(&cluster.endpoints()).await?,
        _ => Client::connect(lib, &cluster.url())?,
    };
    let client = Arc::new(client);
    client.warm_up(tag).await?;
    Ok(client)
}

/// Adds `ratio_to_etcd_lock` of `key` to every row, against etcd-lock's row.
fn relate_to_etcd_lock(rows: &mut [(LibId, Outcome)], key: &str) {
    let reference = rows.iter().find_map(|(lib, outcome)| match (lib, outcome) {
        (LibId::EtcdLock, Ok(result)) => result.get(key).and_then(Value::as_f64),
        _ => None,
    });
    let Some(reference) = reference.filter(|rate| *rate > 0.0) else {
        return;
    };
    for (_, outcome) in rows.iter_mut() {
        if let Ok(result) = outcome {
            if let Some(rate) = result.get(key).and_then(Value::as_f64) {
                result.insert("ratio_to_etcd_lock".into(), (rate / reference).into());
            }
        }
    }
}
