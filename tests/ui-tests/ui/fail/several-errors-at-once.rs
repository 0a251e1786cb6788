use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "job:<jbo>", wait = "1 sec", on_lost = "panic")]
async fn run(job: u64) -> Result<u64, AppError> {
    Ok(job)
}

fn main() {}
