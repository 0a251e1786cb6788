//! Names bound inside parameter patterns can be named by placeholders. Each call runs on the
//! in-process backend and checks, inside its body, which key it holds.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[path = "../support/in_process.rs"]
mod in_process;
use in_process::assert_holds;

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
    assert_holds("order:1").await;
    Ok(id)
}

#[distributed_lock(key = "cell:<a>:<b>")]
pub async fn by_tuple((a, b): (u32, u32)) -> Result<u32, AppError> {
    assert_holds("cell:1:2").await;
    Ok(a + b)
}

#[distributed_lock(key = "user:<user>:<id>")]
pub async fn by_struct(
    Path(id): Path<u64>,
    Json(Body { user, amount, .. }): Json<Body>,
) -> Result<u64, AppError> {
    assert_holds("user:u:1").await;
    Ok(id + amount + user.len() as u64)
}

#[distributed_lock(key = "wrapped:<inner>:<whole.0>")]
pub async fn by_binding(whole @ Path(inner): Path<u32>) -> Result<u32, AppError> {
    assert_holds("wrapped:3:3").await;
    let Path(again) = whole;
    Ok(inner + again)
}

fn main() {
    in_process::run("default", |_| async {
        assert_eq!(by_path(Path(1)).await.unwrap(), 1);
        assert_eq!(by_tuple((1, 2)).await.unwrap(), 3);
        let body = Body {
            user: "u".into(),
            amount: 2,
            note: String::new(),
        };
        assert_eq!(by_struct(Path(1), Json(body)).await.unwrap(), 4);
        assert_eq!(by_binding(Path(3)).await.unwrap(), 6);
    });
}
