use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub trait Jobs {
    #[distributed_lock(key = "job:<id>")]
    async fn run(&self, id: u64) -> Result<u64, AppError>;
}

fn main() {}
