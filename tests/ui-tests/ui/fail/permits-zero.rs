use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "api:<id>", permits = 0)]
async fn run(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
