//! Attributes, doc comments, visibility, inner attributes and `#[must_use]` are kept.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub mod ledger {
    use super::*;

    /// Debits the order.
    ///
    /// Doc comments stay on the generated function.
    #[must_use = "the receipt proves the payment"]
    #[distributed_lock(key = "order:<id>")]
    #[inline]
    #[allow(clippy::needless_return)]
    pub(crate) async fn pay(id: u64) -> Result<u64, AppError> {
        #![allow(unused_variables)]
        let unused = 1;
        Ok(id)
    }

    #[cfg(any())]
    #[distributed_lock(key = "never-compiled")]
    pub async fn gone() -> Result<(), AppError> {
        Ok(())
    }
}

#[deprecated = "kept too"]
#[distributed_lock(key = "old:<id>")]
pub async fn old(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {
    let _receipt = ledger::pay(1);
    #[allow(deprecated)]
    drop(old(2));
}
