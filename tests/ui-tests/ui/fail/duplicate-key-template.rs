use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(keys = ["account:<from>", "account:<from>"])]
async fn transfer(from: u64, to: u64) -> Result<u64, AppError> {
    Ok(from + to)
}

fn main() {}
