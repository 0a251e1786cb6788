//! The etcd engine under faults, on a real 3-member etcd cluster started per test: the tests
//! written once for etcd and ZooKeeper (`consensus_faults`: the leader killed and a follower
//! paused under load from several processes, a holder paused past its lease, the majority of
//! members down, waiters woken in queue order), called here on etcd under their names, and a
//! member cut off from the client.
//!
//! Figures are printed as `ETCD …` lines on stderr.

mod common;
mod consensus_faults;

use consensus_faults::backend;
use distlock_test_support::{EtcdCluster, FaultProxy};
use std::time::Duration;

/// The entry point of every worker process; a no-op in a normal test run.
#[test]
fn worker_entry() {
    let Some(role) = common::worker::role() else {
        return;
    };
    common::worker::runtime().block_on(consensus_faults::play(&role));
}

consensus_faults::tests_on!(EtcdCluster);

/// One member cut off from the client (its connection through the fault proxy blackholed:
/// requests sent there are never answered): locks go on through the other members, each call
/// within its wait budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_cut_off_from_the_client_does_not_stop_locks() {
    let cluster = EtcdCluster::start(3);
    let proxy = FaultProxy::start(cluster.client_addr(0)).await;
    let endpoints = cluster.endpoints();
    let url = format!("etcd://{},{},{}", proxy.addr(), endpoints[1], endpoints[2]);
    let backend = backend(&url, Duration::from_secs(5));
    let budget = Duration::from_secs(5);
    consensus_faults::cycles(&backend, "before", 10, budget).await;
    proxy.blackhole(true);
    let slowest = consensus_faults::cycles(&backend, "cut", 20, budget).await;
    let stats = backend.stats();
    eprintln!(
        "ETCD member cut off: 20 lock cycles through the other two members, the slowest \
         {slowest:?}; {} requests held by the blackholed proxy",
        proxy.requests_held()
    );
    assert!(stats.acquired >= 30, "{stats:?}");
}
