use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "order:<order.number>")]
async fn pay(order: &Order) -> Result<u64, AppError> {
    Ok(order.id)
}

pub struct Order {
    pub id: u64,
}

fn main() {}
