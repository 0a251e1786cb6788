//! `impl Trait` in the `Ok` type: the fake return edge erases it to `_`.
#![deny(warnings)]

use std::fmt::Display;

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

#[distributed_lock(key = "report:<id>")]
pub async fn report(id: u64) -> Result<impl Display, AppError> {
    let text = format!("report {id}");
    Ok(text)
}

#[distributed_lock(key = "reports:<day>")]
pub async fn reports(day: u32) -> Result<Vec<impl Display + Send>, AppError> {
    Ok(vec![day, day + 1])
}

fn main() {
    drop(report(1));
    drop(reports(2));
}
