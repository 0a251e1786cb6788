use distlock::{distributed_lock, LockError};

pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub struct Tenant {
    pub id: u64,
}

impl Tenant {
    #[distributed_lock(key = "tenant:<self>")]
    async fn pay(&self) -> Result<u64, AppError> {
        Ok(self.id)
    }
}

fn main() {}
