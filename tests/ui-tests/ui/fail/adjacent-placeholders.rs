use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "pair:<left>-<right>")]
async fn swap(left: &str, right: &str) -> Result<usize, AppError> {
    Ok(left.len() + right.len())
}

fn main() {}
