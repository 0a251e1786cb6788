//! A trait-impl method with `async fn` in traits, including a trait that requires `Send` futures.
#![deny(warnings)]

use std::future::Future;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub trait Jobs {
    #[allow(async_fn_in_trait)]
    async fn run(&self, id: u64) -> Result<u64, AppError>;

    fn run_send(&self, id: u64) -> impl Future<Output = Result<u64, AppError>> + Send;
}

pub struct Worker {
    pub shard: u16,
}

impl Jobs for Worker {
    #[distributed_lock(key = "job:<self.shard>:<id>")]
    async fn run(&self, id: u64) -> Result<u64, AppError> {
        Ok(id + u64::from(self.shard))
    }

    #[distributed_lock(key = "job:<self.shard>:<id>", on_lost = "abort")]
    async fn run_send(&self, id: u64) -> Result<u64, AppError> {
        Ok(id)
    }
}

fn main() {
    let worker = Worker { shard: 3 };
    drop(worker.run(1));
    drop(worker.run_send(2));
}
