//! `mode = "read"` / `"write"` and `permits = N`: shared read locks, exclusive locks, semaphores.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "doc:<id>", mode = "read")]
pub async fn read(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "doc:<id>", mode = "write", wait = "1s")]
pub async fn write(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "api:<tenant>", permits = 3, wait = "forever")]
pub async fn call_api(tenant: u64) -> Result<u64, AppError> {
    Ok(tenant)
}

#[distributed_lock(permits = 1, key = "api:<tenant>", lease = "30s")]
pub async fn one_permit(tenant: u64) -> Result<u64, AppError> {
    Ok(tenant)
}

#[distributed_lock(keys = ["doc:<a>", "doc:<b>"], mode = "read", max_hold = "5m")]
pub async fn compare(a: u64, b: u64) -> Result<bool, AppError> {
    Ok(a == b)
}

fn main() {
    drop(read(1));
    drop(write(2));
    drop(call_api(3));
    drop(one_permit(4));
    drop(compare(5, 6));
}
