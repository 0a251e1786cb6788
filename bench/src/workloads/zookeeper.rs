//! Workload 12: zookeeper — distlock's ZooKeeper engine beside the lock recipe of
//! zookeeper-client 0.11.2 itself (`Client::lock` with Curator's prefix: an ephemeral sequential
//! node, each waiter watching the node ahead of its own, the node deleted at the release), the
//! crate distlock's engine is built on, on the same 3-server ensemble of the run's own, in one
//! run: a sequential cycle of distinct keys, and one key contended by several tasks (rate,
//! fairness, worst wait). Ratios are to zookeeper-client in the same repetition. The ensemble
//! is the harness's (a tick of 100 ms, data in `/dev/shm`, no fsync per write: `forceSync=no`),
//! for both libraries alike.
//!
//! Unlike the mysql workload's, every contending task has a session of its own — one distlock
//! backend, or one zookeeper-client client, each — as separate processes would: a ZooKeeper
//! lock's contenders are sessions. The sequential phase runs on the first of them, and also
//! records what a cycle costs in CPU, in this process and in the three servers together (three
//! JVMs, read from `/proc`): on one shared CPU, that is what bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::cpu_of;
use crate::pin::Pin;
use crate::workloads::contended::{analyze, contend_apart};
use crate::workloads::{cycles_with_cpu, relate_to};
use distlock_test_support::ZkEnsemble;
use std::sync::Arc;
use std::time::Duration;

/// The libraries of this workload: distlock on ZooKeeper, and zookeeper-client's lock.
const LIBS: [LibId; 2] = [LibId::Distlock, LibId::ZookeeperClient];

/// The field each row gets: its rate as a ratio to zookeeper-client's.
const RATIO: &str = "ratio_to_zookeeper_client";

/// The servers of the ensemble.
const SERVERS: usize = 3;

/// A 3-server ensemble for the workload (the harness's settings), every server placed by
/// `pin`.
pub(crate) fn start(pin: Pin) -> Result<ZkEnsemble, String> {
    let ensemble = ZkEnsemble::start(SERVERS);
    // One JVM per server: its threads, and those it starts later, are placed with it.
    for pid in ensemble.pids() {
        pin.server(pid)?;
    }
    Ok(ensemble)
}

/// A repetition whose numbers are dropped, run once on a new ensemble before the first one: a
/// server's JVM interprets its code until its JIT compiler has seen it run often enough, and the
/// first library measured would otherwise pay for that alone. A library that fails here fails
/// again in the repetitions, which report it.
pub(crate) async fn warm(
    ensemble: &ZkEnsemble,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
) {
    measure(ensemble, duration, contenders, critical_section, "warm").await;
}

/// One repetition: each library, sequential then contended, in the same order.
pub(crate) async fn run(
    ensemble: &ZkEnsemble,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let label = rep.to_string();
    measure(ensemble, duration, contenders, critical_section, &label).await
}

/// Each library, sequential then contended, on keys named after `label`.
async fn measure(
    ensemble: &ZkEnsemble,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    label: &str,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let mut sequential = Vec::new();
    let mut contended = Vec::new();
    for lib in LIBS {
        let tag = format!("zookeeper-{}-{label}", lib.name());
        let clients = match sessions(lib, ensemble, contenders, &tag).await {
            Ok(clients) => clients,
            Err(reason) => {
                sequential.push((lib, Err(reason.clone())));
                contended.push((lib, Err(reason)));
                continue;
            }
        };
        let servers = ensemble.pids();
        let cpu_of_servers = || servers.iter().map(|&pid| cpu_of(pid)).sum::<Duration>();
        let outcome = cycles_with_cpu(
            &clients[0],
            duration,
            &tag,
            "zookeeper_cpu_us_per_cycle",
            cpu_of_servers,
        )
        .await;
        sequential.push((lib, outcome));
        let outcome = contend_apart(&clients, &format!("busy:{tag}"), duration, critical_section)
            .await
            .and_then(|acquisitions| analyze(acquisitions, contenders, 1));
        contended.push((lib, outcome));
    }
    relate_to(
        &mut sequential,
        LibId::ZookeeperClient,
        "cycles_per_s",
        RATIO,
    );
    relate_to(&mut contended, LibId::ZookeeperClient, "cs_per_s", RATIO);
    vec![
        ("zookeeper_sequential", sequential),
        ("zookeeper_contended", contended),
    ]
}

/// `count` clients of `lib` on the ensemble, each its own session, connected, with a few cycles
/// done.
async fn sessions(
    lib: LibId,
    ensemble: &ZkEnsemble,
    count: usize,
    tag: &str,
) -> Result<Vec<Arc<Client>>, String> {
    let mut clients = Vec::with_capacity(count);
    for i in 0..count {
        let client = match lib {
            LibId::ZookeeperClient => Client::zookeeper_client(&ensemble.hosts()).await?,
            _ => Client::connect(lib, &ensemble.url())?,
        };
        let client = Arc::new(client);
        client.warm_up(&format!("{tag}-{i}")).await?;
        clients.push(client);
    }
    Ok(clients)
}
