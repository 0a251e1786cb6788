//! Workload 11: mysql — distlock's MySQL engine beside distributed-lock-mysql (user-level locks:
//! `GET_LOCK` on a pooled connection, `RELEASE_LOCK` at the release), on the same MariaDB server
//! of the run's own, in one run: a sequential cycle of distinct keys, and one key contended by
//! several tasks (rate, fairness, worst wait). Ratios are to distributed-lock-mysql in the same
//! repetition. The server is the harness's (data in `/dev/shm`, InnoDB's log written to the
//! kernel at each commit and flushed to the disk once a second:
//! `innodb_flush_log_at_trx_commit=2`), for both libraries alike, so that no commit waits for the
//! disk and what is measured is the locking, not the disk: distlock's commits write lease rows,
//! whose redo log would be flushed; the peer's user-level locks live in the server's memory and
//! write nothing. The sequential phase also records what a cycle costs in CPU, in this process
//! and in the server (`mariadbd`, one process whose threads serve every connection): on one
//! shared CPU, that is what bounds the rate.

use super::Outcome;
use crate::clients::{Client, LibId};
use crate::measure::cpu_of;
use crate::pin::Pin;
use crate::workloads::contended::{analyze, contend};
use crate::workloads::{cycles_with_cpu, relate_to};
use distlock_test_support::MariaDbServer;
use std::sync::Arc;
use std::time::Duration;

/// The libraries of this workload: distlock on MySQL, and distributed-lock-mysql.
const LIBS: [LibId; 2] = [LibId::Distlock, LibId::DistributedLockMysql];

/// The lock database distlock's tables and procedures are installed in: its default.
const SCHEMA: &str = "distlock";

/// The field each row gets: its rate as a ratio to distributed-lock-mysql's.
const RATIO: &str = "ratio_to_distributed_lock_mysql";

/// A MariaDB server for the workload (the harness's settings, which already keep commits off
/// the disk), placed by `pin`, with distlock's schema installed.
pub(crate) fn start(pin: Pin) -> Result<MariaDbServer, String> {
    let server = MariaDbServer::start();
    // One process: its threads, and those it starts later, are placed with it.
    pin.server(server.pid())?;
    let schema = distlock::mysql::schema(SCHEMA).map_err(|err| err.to_string())?;
    server.sql(&schema);
    Ok(server)
}

/// One repetition: each library, sequential then contended, in the same order.
pub(crate) async fn run(
    server: &MariaDbServer,
    duration: Duration,
    contenders: usize,
    critical_section: Duration,
    rep: usize,
) -> Vec<(&'static str, Vec<(LibId, Outcome)>)> {
    let mut sequential = Vec::new();
    let mut contended = Vec::new();
    for lib in LIBS {
        let tag = format!("mysql-{}-{rep}", lib.name());
        let client = match connect_warm(lib, server, &tag).await {
            Ok(client) => client,
            Err(reason) => {
                sequential.push((lib, Err(reason.clone())));
                contended.push((lib, Err(reason)));
                continue;
            }
        };
        let mariadbd = server.pid();
        let outcome = cycles_with_cpu(&client, duration, &tag, "mysql_cpu_us_per_cycle", || {
            cpu_of(mariadbd)
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
        LibId::DistributedLockMysql,
        "cycles_per_s",
        RATIO,
    );
    relate_to(
        &mut contended,
        LibId::DistributedLockMysql,
        "cs_per_s",
        RATIO,
    );
    vec![
        ("mysql_sequential", sequential),
        ("mysql_contended", contended),
    ]
}

/// A client of `lib` on the server, connected, with a few cycles done.
async fn connect_warm(
    lib: LibId,
    server: &MariaDbServer,
    tag: &str,
) -> Result<Arc<Client>, String> {
    let client = match lib {
        LibId::DistributedLockMysql => Client::distributed_lock_mysql(&server.url()).await?,
        _ => Client::connect(lib, &server.url())?,
    };
    let client = Arc::new(client);
    client.warm_up(tag).await?;
    Ok(client)
}
