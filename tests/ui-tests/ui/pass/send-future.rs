//! The call's future is `Send` when the body is, so annotated functions can be `tokio::spawn`ed.
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

#[distributed_lock(key = "job:<id>", on_lost = "checkpoint")]
pub async fn checkpointed(id: u64) -> Result<u64, AppError> {
    let doubled = id * 2;
    Ok(doubled)
}

#[distributed_lock(key = "job:<id>", on_lost = "abort")]
pub async fn aborting(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "job:<id>", on_lost = "ignore")]
pub async fn ignoring(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn assert_send<F: Future + Send + 'static>(future: F) -> F {
    future
}

fn main() {
    drop(assert_send(checkpointed(1)));
    drop(assert_send(aborting(2)));
    drop(assert_send(ignoring(3)));
}
