//! A bank over HTTP (axum 0.8) whose handlers lock the accounts they change, served by the
//! `axum_service` example and driven by the `axum_service` test of `distlock-tests`.
//!
//! | route | body | lock |
//! |---|---|---|
//! | `GET /accounts/{id}` | — | none: one read of one account |
//! | `POST /accounts/{id}/deposit` | `{"amount": 100}` | `account:<id>`, waits up to 5 s |
//! | `POST /transfers` | `{"from": 1, "to": 2, "amount": 30}` | both accounts, all or none, waits up to 5 s |
//! | `DELETE /accounts/{id}` | — | `account:<id>`, does not wait |
//! | `GET /ready` | — | none: [`Backend::ping`](distlock::Backend::ping) — 200, or 503 with why |
//!
//! Each answers with the account(s) as JSON, `{"id": 1, "balance": 100}`; an account nobody has
//! paid into holds 0. Failures:
//!
//! - **409 Conflict** with `Retry-After`: the account is locked by someone else for longer than
//!   the handler waits ([`LockError::Busy`]);
//! - **503 Service Unavailable**: the lock backend failed, the lock was lost mid-request, or the
//!   service is shutting down;
//! - **422 Unprocessable Entity**: a request that cannot be carried out (a transfer to the same
//!   account, or of more than the balance), and — axum's own rejection — a body of the wrong shape,
//!   such as a zero or negative amount;
//! - **400 Bad Request**: a body that is not JSON (axum's own rejection).
//!
//! Locks live on the `"default"` backend of [`distlock::Registry`]: register one at start-up,
//! or set `DISTLOCK_URL`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use distlock::{distributed_lock, LockError};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::num::NonZeroU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

/// How long one ledger access takes: a database round trip, in a real service. It is what a
/// missing lock would show: two deposits that read the same balance across it both write
/// `balance + amount`, and one of them is lost.
const LEDGER_LATENCY: Duration = Duration::from_millis(1);

/// Balances, with no atomic read-modify-write of their own: only the account locks keep
/// concurrent updates apart. A cheap `Clone` handle.
#[derive(Clone, Default)]
pub struct Ledger {
    balances: Arc<Mutex<HashMap<u64, u64>>>,
}

impl Ledger {
    async fn read(&self, id: u64) -> u64 {
        tokio::time::sleep(LEDGER_LATENCY).await;
        *self.balances.lock().unwrap().get(&id).unwrap_or(&0)
    }

    /// Writes every entry in one access, so a transfer cannot be stopped between its debit and
    /// its credit.
    async fn write(&self, entries: &[(u64, u64)]) {
        tokio::time::sleep(LEDGER_LATENCY).await;
        self.balances
            .lock()
            .unwrap()
            .extend(entries.iter().copied());
    }

    async fn remove(&self, id: u64) -> u64 {
        tokio::time::sleep(LEDGER_LATENCY).await;
        self.balances.lock().unwrap().remove(&id).unwrap_or(0)
    }
}

/// One account, as every route answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub id: u64,
    pub balance: u64,
}

/// `POST /accounts/{id}/deposit`. A zero or negative amount does not deserialize, so axum
/// rejects it before any lock is taken.
#[derive(Debug, Deserialize)]
pub struct Deposit {
    pub amount: NonZeroU64,
}

/// `POST /transfers`.
#[derive(Debug, Deserialize)]
pub struct Transfer {
    pub from: u64,
    pub to: u64,
    pub amount: NonZeroU64,
}

/// The answer to a transfer: both accounts after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transferred {
    pub from: Account,
    pub to: Account,
}

/// Everything a handler can fail with; each variant is one status.
#[derive(Debug)]
pub enum ApiError {
    /// The lock said no: answered by distlock's `IntoResponse` (busy 409, failing, lost or
    /// shutting down 503, misconfigured 500).
    Lock(LockError),
    /// 422: the request is well-formed but cannot be carried out.
    Invalid(String),
}

impl From<LockError> for ApiError {
    fn from(err: LockError) -> Self {
        ApiError::Lock(err)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Lock(err) => write!(f, "{err}"),
            ApiError::Invalid(why) => f.write_str(why),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        match self {
            ApiError::Invalid(why) => (StatusCode::UNPROCESSABLE_ENTITY, why).into_response(),
            // distlock's own mapping (feature `axum`): 409 with Retry-After from the holder's
            // remaining lease, 503 when the backend fails or shuts down, 500 otherwise.
            ApiError::Lock(err) => err.into_response(),
        }
    }
}

/// The routes of the table above, on `ledger`.
pub fn router(ledger: Ledger) -> Router {
    Router::new()
        .route("/accounts/{id}", get(balance).delete(close))
        .route("/accounts/{id}/deposit", post(deposit))
        .route("/transfers", post(transfer))
        .route("/ready", get(ready))
        .with_state(ledger)
}

/// Readiness: the lock backend takes locks now (connections, credentials, rights). A load
/// balancer sends no traffic to an instance that answers 503.
async fn ready() -> Response {
    let checked = match distlock::Registry::global().get(distlock::DEFAULT_BACKEND) {
        Ok(backend) => backend.ping().await,
        Err(not_configured) => Err(not_configured),
    };
    match checked {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why.to_string()).into_response(),
    }
}

/// Serves [`router`] on `listener` until the process ends.
pub async fn serve(listener: TcpListener, ledger: Ledger) -> std::io::Result<()> {
    axum::serve(listener, router(ledger)).await
}

/// Serves [`router`] on `listener` until `stop` resolves, then shuts down gracefully: no new
/// connections, the requests in flight finish (and release their locks), and then every lock
/// backend is shut down ([`Registry::shutdown_all`](distlock::Registry::shutdown_all)) — a lock
/// a request still held is released now, not left to its TTL for the next instance to wait out.
pub async fn serve_until(
    listener: TcpListener,
    ledger: Ledger,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(ledger))
        .with_graceful_shutdown(stop)
        .await?;
    distlock::Registry::global()
        .shutdown_all()
        .await
        .map_err(std::io::Error::from)
}

/// A single read needs no lock: the ledger writes every access whole.
async fn balance(State(ledger): State<Ledger>, Path(id): Path<u64>) -> Json<Account> {
    let balance = ledger.read(id).await;
    Json(Account { id, balance })
}

/// Waits its turn: deposits into one account queue behind each other.
#[distributed_lock(key = "account:<id>", wait = "5s")]
async fn deposit(
    State(ledger): State<Ledger>,
    Path(id): Path<u64>,
    Json(Deposit { amount }): Json<Deposit>,
) -> Result<Json<Account>, ApiError> {
    let balance = ledger.read(id).await;
    let balance = balance
        .checked_add(amount.get())
        .ok_or_else(|| ApiError::Invalid(format!("account {id} cannot hold more")))?;
    ledger.write(&[(id, balance)]).await;
    Ok(Json(Account { id, balance }))
}

/// Locks both accounts, in a canonical order, so that transfers `1 → 2`, `2 → 3` and `3 → 1`
/// running together cannot deadlock.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "5s")]
async fn transfer(
    State(ledger): State<Ledger>,
    Json(Transfer { from, to, amount }): Json<Transfer>,
) -> Result<Json<Transferred>, ApiError> {
    if from == to {
        return Err(ApiError::Invalid(format!(
            "cannot transfer from account {from} to itself"
        )));
    }
    let (from_balance, to_balance) = (ledger.read(from).await, ledger.read(to).await);
    let from_balance = from_balance.checked_sub(amount.get()).ok_or_else(|| {
        ApiError::Invalid(format!(
            "account {from} holds {from_balance}, less than {amount}"
        ))
    })?;
    let to_balance = to_balance
        .checked_add(amount.get())
        .ok_or_else(|| ApiError::Invalid(format!("account {to} cannot hold more")))?;
    ledger
        .write(&[(from, from_balance), (to, to_balance)])
        .await;
    Ok(Json(Transferred {
        from: Account {
            id: from,
            balance: from_balance,
        },
        to: Account {
            id: to,
            balance: to_balance,
        },
    }))
}

/// Does not wait: closing an account someone is paying into is refused (409), and the client
/// decides whether to try again.
#[distributed_lock(key = "account:<id>")]
async fn close(
    State(ledger): State<Ledger>,
    Path(id): Path<u64>,
) -> Result<Json<Account>, ApiError> {
    let balance = ledger.remove(id).await;
    Ok(Json(Account { id, balance }))
}
