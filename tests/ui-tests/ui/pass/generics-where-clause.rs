//! Generic parameters, lifetimes and where-clauses are kept; `E` may itself be generic.
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

#[distributed_lock(key = "item:<id>")]
pub async fn store<'a, K, V: Clone>(id: &'a K, value: &V) -> Result<V, AppError>
where
    K: Display + ?Sized,
{
    Ok(value.clone())
}

#[distributed_lock(key = "item:<id>", wait = "250ms")]
pub async fn generic_error<E>(id: u32) -> Result<u32, E>
where
    E: From<LockError>,
{
    Ok(id)
}

pub struct Cache<T> {
    pub name: String,
    pub value: T,
}

impl<T: Clone + Send> Cache<T> {
    #[distributed_lock(key = "cache:<self.name>")]
    pub async fn get(&self) -> Result<T, AppError> {
        Ok(self.value.clone())
    }

    #[distributed_lock(key = "cache:<self.name>")]
    pub async fn borrow_name(&self) -> Result<&str, AppError> {
        Ok(&self.name)
    }
}

fn main() {
    drop(store("a", &1u8));
    drop(generic_error::<AppError>(1));
    let cache = Cache {
        name: "c".into(),
        value: 5,
    };
    drop(cache.get());
    drop(cache.borrow_name());
}
