//! distlock in five minutes: run with `cargo run -p distlock-examples --example quickstart`.
//!
//! Uses the in-process backend unless `DISTLOCK_URL` is set (e.g. `redis://127.0.0.1:6379`).

use distlock::{distributed_lock, Backend, LockError, Registry};
use futures_util::future::join_all;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

#[derive(Debug)]
enum AppError {
    Lock(LockError),
}

impl From<LockError> for AppError {
    fn from(err: LockError) -> Self {
        AppError::Lock(err)
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Lock(err) => write!(f, "{err}"),
        }
    }
}

/// A balance store with no atomic operations of its own: only the lock keeps updates apart.
#[derive(Default)]
struct Ledger {
    balances: Mutex<HashMap<u32, u64>>,
}

impl Ledger {
    fn read(&self, account: u32) -> u64 {
        *self.balances.lock().unwrap().get(&account).unwrap_or(&0)
    }

    fn write(&self, account: u32, balance: u64) {
        self.balances.lock().unwrap().insert(account, balance);
    }
}

/// Read, think, write: without the lock, concurrent deposits would overwrite each other.
#[distributed_lock(key = "account:<account>", wait = "5s")]
async fn deposit(ledger: &Ledger, account: u32, amount: u64) -> Result<u64, AppError> {
    let balance = ledger.read(account);
    tokio::task::yield_now().await; // another task gets to run here
    ledger.write(account, balance + amount);
    Ok(distlock::fencing_token().expect("inside the lock"))
}

/// A call that runs for three watchdog TTLs: the watchdog keeps renewing its lease.
#[distributed_lock(key = "report:nightly", backend = "short-ttl")]
async fn long_report() -> Result<(), AppError> {
    for step in 1..=3 {
        tokio::time::sleep(Duration::from_millis(300)).await;
        println!(
            "   step {step}/3 done, lock still held: {}",
            distlock::is_held()
        );
    }
    Ok(())
}

/// A fixed 150 ms lease and a step that takes 300 ms: the second step never runs.
#[distributed_lock(key = "export:<id>", lease = "150ms")]
async fn slow_export(id: u32) -> Result<(), AppError> {
    println!("   export {id}: step 1 starts");
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!("   export {id}: step 2 — this line must never print");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), AppError> {
    // Where locks live. An explicit choice: distlock never falls back to in-process locks.
    let url = std::env::var(distlock::env::URL).unwrap_or_else(|_| "memory://".into());
    if url == "memory://" {
        Registry::global().register("default", Backend::in_process())?;
        println!(
            "backend: in-process (set {} to use Redis)",
            distlock::env::URL
        );
    } else {
        println!(
            "backend: {} (from {})",
            Registry::global().get("default")?.name(),
            distlock::env::URL
        );
    }
    let short_ttl = Backend::builder(url)
        .watchdog_lease(Duration::from_millis(300))
        .build()?;
    Registry::global().register("short-ttl", short_ttl)?;

    println!("\n1. eight concurrent deposits of 10 into one account, serialised by the lock");
    let ledger = Ledger::default();
    let tokens = join_all((0..8).map(|_| deposit(&ledger, 7, 10))).await;
    for token in tokens {
        println!("   deposit done under fencing token {}", token?);
    }
    println!("   balance: {} (expected 80)", ledger.read(7));
    assert_eq!(ledger.read(7), 80);

    println!("\n2. a call three times longer than its 300 ms lease, renewed by the watchdog");
    long_report().await?;

    println!("\n3. a lease lost in the middle of a call stops it at the next step");
    match slow_export(1).await {
        Err(AppError::Lock(err)) => println!("   stopped: {err}"),
        Ok(()) => unreachable!("the lease cannot outlive a 300 ms step"),
    }
    Ok(())
}
