//! Every argument set explicitly, and each alternative value of each.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(
    key = "job:<id>",
    wait = "forever",
    lease = "watchdog",
    on_lost = "checkpoint",
    backend = "jobs",
    max_hold = "5m"
)]
pub async fn all(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(
    max_hold = "1h",
    backend = "default",
    on_lost = "abort",
    lease = "watchdog",
    wait = "0",
    key = "job:<id>"
)]
pub async fn reordered(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "job:<id>", wait = "250ms", lease = "100ms", on_lost = "ignore")]
pub async fn fixed_short(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = r"job:<id>", wait = "2m", lease = "1h")]
pub async fn raw_string(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    drop(all(1));
    drop(reordered(2));
    drop(fixed_short(3));
    drop(raw_string(4));
}
