//! distlock's metrics in Prometheus's text format: run with
//! `cargo run -p distlock-examples --example metrics`.
//!
//! Installs the Prometheus recorder, runs a small workload on the in-process backend — orders
//! shipped, one of them busy, a report whose fixed lease runs out before it is released — and
//! prints what a scrape would return. Every series is labelled with the backend's registry name
//! and the lock's key template (`order:<id>`), never with a rendered key (`order:3`).
//!
//! A service serves `handle.render()` on its `/metrics` route (or enables the exporter's
//! `http-listener` feature), and calls `handle.run_upkeep()` every few seconds.

use distlock::{distributed_lock, Backend, Lease, Lock, LockError, Registry};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use std::time::Duration;

/// Ships an order under the lock `order:<id>`; `wait = "0"`: a busy order fails at once.
#[distributed_lock(key = "order:<id>", backend = "orders")]
async fn ship(id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Buckets make the `_seconds` histograms Prometheus histograms (the exporter's default is
    // a summary).
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Suffix("_seconds".into()),
            &[0.001, 0.01, 0.1, 1.0, 10.0],
        )?
        .install_recorder()?;
    distlock::describe_metrics();

    Registry::global().register("orders", Backend::in_process())?;

    for id in 1..=3 {
        ship(id).await?;
    }

    // A lock taken by hand, labelled like the attribute's: `ship(4)` meanwhile finds it busy.
    let packing = Lock::new("order:4")
        .template("order:<id>")
        .backend("orders")
        .acquire()
        .await?;
    let busy = ship(4).await.unwrap_err();
    println!("ship(4) while it is being packed: {busy}");
    packing.release().await?;

    // A fixed lease that runs out before the work is done: the loss is counted, and so is the
    // release that finds the lock expired.
    let report = Lock::new("report:2024-06-01")
        .template("report:<day>")
        .backend("orders")
        .lease(Lease::Fixed(Duration::from_millis(200)))
        .acquire()
        .await?;
    let lost = report.lost().await;
    println!("the report's lease: {lost}");
    // Past the server-side TTL too, which outlasts the local validity by the drift margin.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let found = report.release().await?;
    println!("its release found: {found:?}");

    println!("\n{}", handle.render());
    Ok(())
}
