//! Names bound inside parameter patterns can be named by placeholders.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug)]
pub struct AppError(pub LockError);

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError(error)
    }
}

pub struct Path<T>(pub T);

pub struct Json<T>(pub T);

pub struct Body {
    pub user: String,
    pub amount: u64,
    pub note: String,
}

#[distributed_lock(key = "order:<id>")]
pub async fn by_path(Path(id): Path<u64>) -> Result<u64, AppError> {
    Ok(id)
}

#[distributed_lock(key = "cell:<a>:<b>")]
pub async fn by_tuple((a, b): (u32, u32)) -> Result<u32, AppError> {
    Ok(a + b)
}

#[distributed_lock(key = "user:<user>:<id>")]
pub async fn by_struct(
    Path(id): Path<u64>,
    Json(Body { user, amount, .. }): Json<Body>,
) -> Result<u64, AppError> {
    Ok(id + amount + user.len() as u64)
}

#[distributed_lock(key = "wrapped:<inner>:<whole.0>")]
pub async fn by_binding(whole @ Path(inner): Path<u32>) -> Result<u32, AppError> {
    let Path(again) = whole;
    Ok(inner + again)
}

fn main() {
    drop(by_path(Path(1)));
    drop(by_tuple((1, 2)));
    drop(by_struct(
        Path(1),
        Json(Body {
            user: "u".into(),
            amount: 2,
            note: String::new(),
        }),
    ));
    drop(by_binding(Path(3)));
}
