//! Service handlers with extractor-style arguments, locked by the values inside them.
//!
//! Web frameworks hand handlers their inputs wrapped in extractors (`Path(id): Path<u64>`,
//! `Json(body): Json<T>`); the key template names the bindings inside the patterns. The two
//! extractor types below stand in for a framework's. Run with
//! `cargo run -p distlock-examples --example service`.

use distlock::{distributed_lock, Backend, LockError, Registry};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A path parameter, as a web framework would extract it.
struct Path<T>(T);
/// A JSON body, as a web framework would extract it.
struct Json<T>(T);

struct Transfer {
    from: u32,
    to: u32,
    amount: i64,
}

#[derive(Debug)]
enum ApiError {
    /// 409: someone else is working on this account right now.
    Conflict(String),
    /// 503: the lock service failed.
    Unavailable(String),
    /// 422: the request itself is wrong.
    Invalid(&'static str),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Conflict(why) => write!(f, "409 Conflict: {why}"),
            ApiError::Unavailable(why) => write!(f, "503 Service Unavailable: {why}"),
            ApiError::Invalid(why) => write!(f, "422 Unprocessable Entity: {why}"),
        }
    }
}

impl From<LockError> for ApiError {
    fn from(err: LockError) -> Self {
        match err {
            LockError::Busy { .. } => ApiError::Conflict(err.to_string()),
            other => ApiError::Unavailable(other.to_string()),
        }
    }
}

#[derive(Clone, Default)]
struct Accounts(Arc<Mutex<HashMap<u32, i64>>>);

impl Accounts {
    fn balance(&self, id: u32) -> i64 {
        *self.0.lock().unwrap().get(&id).unwrap_or(&0)
    }

    fn set(&self, id: u32, balance: i64) {
        self.0.lock().unwrap().insert(id, balance);
    }
}

/// `GET /accounts/:id/close` — one account, keyed by the path parameter.
#[distributed_lock(key = "account:<id>", wait = "200ms")]
async fn close_account(accounts: Accounts, Path(id): Path<u32>) -> Result<i64, ApiError> {
    let balance = accounts.balance(id);
    accounts.set(id, 0);
    Ok(balance)
}

/// `POST /transfers` — two accounts at once, all or none, in a canonical order, so that
/// `transfer(a → b)` and `transfer(b → a)` running together cannot deadlock.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s")]
async fn transfer(
    accounts: Accounts,
    Json(Transfer { from, to, amount }): Json<Transfer>,
) -> Result<(), ApiError> {
    if from == to {
        return Err(ApiError::Invalid("cannot transfer to the same account"));
    }
    let (a, b) = (accounts.balance(from), accounts.balance(to));
    tokio::task::yield_now().await;
    accounts.set(from, a - amount);
    accounts.set(to, b + amount);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), ApiError> {
    Registry::global().register("default", Backend::in_process())?;
    let accounts = Accounts::default();
    accounts.set(1, 1_000);
    accounts.set(2, 1_000);

    // 100 transfers each way, concurrently.
    let mut requests = Vec::new();
    for i in 0..200 {
        let accounts = accounts.clone();
        let (from, to) = if i % 2 == 0 { (1, 2) } else { (2, 1) };
        requests.push(tokio::spawn(transfer(
            accounts,
            Json(Transfer {
                from,
                to,
                amount: 10 + i,
            }),
        )));
    }
    for request in requests {
        request.await.expect("handler panicked")?;
    }
    let total = accounts.balance(1) + accounts.balance(2);
    println!("after 200 concurrent transfers: account 1 = {}, account 2 = {}, total = {total} (expected 2000)", accounts.balance(1), accounts.balance(2));
    assert_eq!(total, 2_000);

    match transfer(
        accounts.clone(),
        Json(Transfer {
            from: 1,
            to: 1,
            amount: 5,
        }),
    )
    .await
    {
        Err(err @ ApiError::Invalid(_)) => println!("rejected: {err}"),
        other => panic!("expected a validation error, got {other:?}"),
    }
    let closed = close_account(accounts.clone(), Path(2)).await?;
    println!("closed account 2 with balance {closed}");

    // While one request holds account 1, a second one gives up after its 200 ms budget.
    let holder = distlock::Lock::new("account:1").acquire().await?;
    match close_account(accounts.clone(), Path(1)).await {
        Err(err @ ApiError::Conflict(_)) => println!("{err}"),
        other => panic!("expected a conflict, got {other:?}"),
    }
    holder.release().await?;
    Ok(())
}
