//! `keys = [..]`: several keys acquired together, all or none.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "2s")]
pub async fn transfer(from: u64, to: u64, amount: u64) -> Result<u64, AppError> {
    Ok(from + to + amount)
}

#[distributed_lock(keys = ["account:<from>",])]
pub async fn single(from: u64) -> Result<u64, AppError> {
    Ok(from)
}

fn main() {
    drop(transfer(1, 2, 3));
    drop(single(1));
}
