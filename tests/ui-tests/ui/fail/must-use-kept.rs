//! `#[must_use]` on the annotated fn survives the expansion: dropping the awaited value is linted.
#![deny(unused_must_use)]

use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[must_use = "the receipt proves the payment"]
#[distributed_lock(key = "order:<id>")]
async fn pay(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

pub async fn caller() {
    pay(7).await;
}

fn main() {}
