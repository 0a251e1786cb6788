//! Workload 10: postgres — distlock's PostgreSQL engine beside distributed-lock-postgres
//! (session advisory locks: `pg_advisory_lock` on a pooled connection, `pg_advisory_unlock` at
//! the release), on the same PostgreSQL server of the run's own, in one run: a sequential cycle
//! of distinct keys, and one key contended by several tasks (rate, fairness, worst wait). Ratios
//! are to distributed-lock-postgres in the same repetition. The server runs with `fsync` off,
//! for both libraries alike, so that no commit waits for a WAL flush to the disk and what is
//! measured is the locking, not the disk: distlock's commits write lease rows, whose WAL would
//! be flushed; the peer's advisory locks live in the server's memory and its transactions write
//! nothing. The sequential phase also records what a cycle costs in CPU, in this process and in
//! the server (the postmaster and every process it has started: backends and background
//! workers): on one shared CPU, that is what bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::{cpu_of, ended_children_cpu_of, parent_of};
use crate::pin::Pin;
use crate::workloads::contended::{analyze, contend};
use crate::workloads::{cycles_with_cpu, relate_to};
use distlock_test_support::PgServer;
use std::sync::Arc;
use std::time::Duration;

/// The libraries of this workload: distlock on PostgreSQL, and distributed-lock-postgres.
const LIBS: [LibId; 2] = [LibId::Distlock, LibId::DistributedLockPg];

/// The schema distlock's lock tables are installed in: its default.
const SCHEMA: &str = "distlock";

/// The field each row gets: its rate as a ratio to distributed-lock-postgres's.
const RATIO: &str = "ratio_to_distributed_lock_pg";

/// A PostgreSQL server for the workload (`fsync` off), every process of it placed by `pin`,
/// with distlock's schema installed.
pub(crate) fn start(pin: Pin) -> Result<PgServer, String> {
    let server = PgServer::start();
    // The postmaster's children started with it; the backends it starts later inherit its CPU.
    for pid in processes(server.pid()) {
        pin.server(pid)?;
    }
    let schema = distlock::postgres::schema(SCHEMA).map_err(|err| err.to_string())?;
    server.psql(&schema);
    Ok(server)
}

/// One repetition: each library, sequential then contended, in the same order.
pub(crate) async fn run(
    server: &PgServer,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let mut sequential = Vec::new();
    let mut contended = Vec::new();
    for lib in LIBS {
        let tag = format!("postgres-{}-{rep}", lib.name());
        let client = match connect_warm(lib, server, &tag).await {
            Ok(client) => client,
            Err(reason) => {
                sequential.push((lib, Err(reason.clone())));
                contended.push((lib, Err(reason)));
                continue;
            }
        };
        let postmaster = server.pid();
        let outcome = cycles_with_cpu(&client, duration, &tag, "postgres_cpu_us_per_cycle", || {
            server_cpu(postmaster)
        })
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
    relate_to(
        &mut sequential,
        LibId::DistributedLockPg,
        "cycles_per_s",
        RATIO,
    );
    relate_to(&mut contended, LibId::DistributedLockPg, "cs_per_s", RATIO);
    vec![
        ("postgres_sequential", sequential),
        ("postgres_contended", contended),
    ]
}

/// A client of `lib` on the server, connected, with a few cycles done.
async fn connect_warm(lib: LibId, server: &PgServer, tag: &str) -> Result<Arc<Client>, String> {
    let client = match lib {
        LibId::DistributedLockPg => Client::distributed_lock_pg(&server.url()).await?,
        _ => Client::connect(lib, &server.url())?,
    };
    let client = Arc::new(client);
    client.warm_up(tag).await?;
    Ok(client)
}

/// The server's process `postmaster` and the processes it has started, running now.
fn processes(postmaster: u32) -> Vec<u32> {
    let children = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| parent_of(pid) == Some(postmaster));
    std::iter::once(postmaster).chain(children).collect()
}

/// CPU time the server has used: the postmaster, the processes it runs now, and those that
/// have ended (a backend ends with its connection).
fn server_cpu(postmaster: u32) -> Duration {
    let ended = ended_children_cpu_of(postmaster);
    let running: Duration = processes(postmaster).into_iter().map(cpu_of).sum();
    ended + running
}
