use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

/// Hides the error type, so the macro cannot check it converts from `LockError`.
pub type Result<T> = std::result::Result<T, AppError>;

#[distributed_lock(key = "job:<id>")]
async fn run(id: u64) -> Result<u64> {
    Ok(id)
}

fn main() {}
