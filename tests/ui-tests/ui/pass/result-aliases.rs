//! A function may return a `Result` alias that hides its error type — a crate's own `Result<T>`,
//! `std::io::Result<T>`, `anyhow::Result<T>` — when that error converts from `LockError`: a lock
//! failure comes back as that error, and the lock is released either way. Runs on the
//! in-process backend, no Redis.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

/// The crate's own alias.
pub type Result<T> = std::result::Result<T, AppError>;

#[distributed_lock(key = "job:<id>")]
async fn own_alias(id: u64) -> Result<u64> {
    distlock::checkpoint()?;
    Ok(id)
}

#[distributed_lock(key = "file:<id>", wait = "0s")]
async fn io_result(id: u64) -> std::io::Result<u64> {
    Ok(id)
}

#[distributed_lock(key = "task:<id>", wait = "0s")]
async fn anyhow_result(id: u64) -> anyhow::Result<u64> {
    anyhow::ensure!(id > 0, "no task 0");
    Ok(id)
}

#[path = "../support/in_process.rs"]
mod in_process;
use in_process::assert_released;

fn main() {
    in_process::run("default", |backend| async move {
        assert_eq!(own_alias(1).await.unwrap(), 1);
        assert_released("job:1").await;
        assert_eq!(io_result(2).await.unwrap(), 2);
        assert!(anyhow_result(0).await.is_err());
        assert_released("task:0").await;

        // Busy: each alias's error carries the LockError.
        let held = distlock::Lock::new("file:3").on(&backend).acquire().await.unwrap();
        let io = io_result(3).await.unwrap_err();
        assert_eq!(io.kind(), std::io::ErrorKind::ResourceBusy);
        let held_too = distlock::Lock::new("task:4").on(&backend).acquire().await.unwrap();
        let any = anyhow_result(4).await.unwrap_err();
        let busy = any.downcast_ref::<LockError>().expect("the LockError");
        assert!(busy.is_busy(), "{busy}");
        held.release().await.unwrap();
        held_too.release().await.unwrap();
    });
}
