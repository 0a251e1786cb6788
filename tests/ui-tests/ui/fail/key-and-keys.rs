use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "job:<id>", keys = ["job:<id>", "queue:<queue>"])]
async fn run(id: u64, queue: u32) -> Result<u64, AppError> {
    Ok(id + u64::from(queue))
}

fn main() {}
