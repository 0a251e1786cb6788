//! A bank over HTTP whose axum handlers hold account locks (the service is `distlock_examples::bank`).
//!
//! ```sh
//! cargo run -p distlock-examples --example axum_service              # 127.0.0.1:3000, in-process locks
//! DISTLOCK_URL=redis://127.0.0.1:6380 cargo run -p distlock-examples --example axum_service 127.0.0.1:8080
//!
//! curl -X POST localhost:3000/accounts/1/deposit -H 'content-type: application/json' -d '{"amount": 100}'
//! curl -X POST localhost:3000/transfers -H 'content-type: application/json' -d '{"from": 1, "to": 2, "amount": 30}'
//! curl localhost:3000/accounts/2
//! curl -X DELETE localhost:3000/accounts/1
//! curl localhost:3000/ready          # 200 while the lock backend takes locks, else 503 and why
//! ```
//!
//! Ctrl-C shuts it down gracefully: requests in flight finish, then the locks still held are
//! released at once (`Registry::shutdown_all`).

use distlock::{Backend, Registry, DEFAULT_BACKEND};
use distlock_examples::bank::{self, Ledger};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // An explicit choice: distlock never falls back to in-process locks by itself.
    if std::env::var_os(distlock::env::URL).is_none() {
        Registry::global().register(DEFAULT_BACKEND, Backend::in_process())?;
    }
    // Built and pinged now, so a bad DISTLOCK_URL, password or ACL stops the program here rather
    // than failing each request.
    let backend = Registry::global().get(DEFAULT_BACKEND)?;
    backend.ping().await?;
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".into());
    let listener = TcpListener::bind(&addr).await?;
    println!(
        "bank listening on http://{} (locks: {backend:?})",
        listener.local_addr()?
    );
    // Ctrl-C (or SIGINT from the supervisor): requests in flight finish, then the locks still
    // held are released at once.
    let stop = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    bank::serve_until(listener, Ledger::default(), stop).await?;
    Ok(())
}
