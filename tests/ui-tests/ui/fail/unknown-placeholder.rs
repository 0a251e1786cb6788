use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "order:<ordr.id>")]
async fn pay(order: &Order, amount: u64) -> Result<u64, AppError> {
    Ok(order.id + amount)
}

pub struct Order {
    pub id: u64,
}

fn main() {}
