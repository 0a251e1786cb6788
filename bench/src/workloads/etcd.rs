//! Workload 8: etcd — distlock's etcd engine beside etcd's own lock service (`Lock`/`Unlock`
//! through etcd-client, each lock bound to a session lease), on the same 3-member cluster, in
//! one run: a sequential cycle of distinct keys, and one key contended by several tasks (rate,
//! fairness, worst wait). Ratios are to etcd's lock service in the same repetition. The
//! sequential phase also records what a cycle costs in CPU, in this process and in the three
//! members together (`/proc`): on one shared CPU, that is what bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::cpu_of;
use crate::workloads::contended::{analyze, contend};
use crate::workloads::{cycles_with_cpu, relate_to};
use distlock_test_support::EtcdCluster;
use std::sync::Arc;
use std::time::Duration;

/// The libraries of this workload: distlock on etcd, and etcd's lock service.
const LIBS: [LibId; 2] = [LibId::Distlock, LibId::EtcdLock];

/// The field each row gets: its rate as a ratio to etcd-lock's.
const RATIO: &str = "ratio_to_etcd_lock";

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
        let outcome = cycles_with_cpu(
            &client,
            duration,
            &tag,
            "etcd_cpu_us_per_cycle",
            cpu_of_members,
        )
        .await;
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
    relate_to(&mut sequential, LibId::EtcdLock, "cycles_per_s", RATIO);
    relate_to(&mut contended, LibId::EtcdLock, "cs_per_s", RATIO);
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
