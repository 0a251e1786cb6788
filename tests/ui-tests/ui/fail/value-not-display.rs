use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "order:<order.tags>")]
async fn pay(order: &Order) -> Result<usize, AppError> {
    Ok(order.tags.len())
}

pub struct Order {
    pub tags: Vec<String>,
}

fn main() {}
