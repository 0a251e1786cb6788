//! The smallest use: a free function, one key, every argument defaulted.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub enum PayError {
    Lock(LockError),
    Declined,
}

impl From<LockError> for PayError {
    fn from(error: LockError) -> Self {
        PayError::Lock(error)
    }
}

pub struct Order {
    pub id: u64,
    pub total: u64,
}

#[distributed_lock(key = "order:<order.id>")]
pub async fn pay(order: &Order, amount: u64) -> Result<u64, PayError> {
    if amount > order.total {
        return Err(PayError::Declined);
    }
    let left = order.total - amount;
    Ok(left)
}

/// A key with no placeholder is one lock for every call.
#[distributed_lock(key = "nightly-report")]
pub async fn nightly_report() -> Result<(), PayError> {
    Ok(())
}

fn main() {
    let order = Order { id: 1, total: 10 };
    // Creating the futures type-checks the calls; they are never polled, so nothing is locked.
    drop(pay(&order, 3));
    drop(nightly_report());
}
