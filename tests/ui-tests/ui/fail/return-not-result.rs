use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "job:<id>")]
async fn run(id: u64) -> Option<u64> {
    Some(id)
}

fn main() {}
