//! `return` and `?` keep their meaning inside the body: they leave the body (and the lock is still
//! released), never the lock handling around it. Runs on the in-process backend, no Redis.
#![deny(warnings)]

use distlock::{distributed_lock, LockError};

#[derive(Debug, PartialEq)]
pub enum AppError {
    Lock(String),
    Parse(String),
    TooLarge,
}

impl From<LockError> for AppError {
    fn from(error: LockError) -> Self {
        AppError::Lock(error.to_string())
    }
}

impl From<std::num::ParseIntError> for AppError {
    fn from(error: std::num::ParseIntError) -> Self {
        AppError::Parse(error.to_string())
    }
}

#[distributed_lock(key = "parse:<text>")]
pub async fn parse_small(text: &str) -> Result<u64, AppError> {
    assert!(distlock::is_held());
    // An item in the body: no checkpoint is inserted before it.
    const LIMIT: u64 = 100;
    let value: u64 = text.parse()?;
    if value > LIMIT {
        return Err(AppError::TooLarge);
    }
    if value == 0 {
        return Ok(LIMIT);
    }
    // `return` inside a closure still returns from the closure only.
    let double = |n: u64| -> u64 {
        if n > 10 {
            return n;
        }
        n * 2
    };
    distlock::checkpoint()?;
    Ok(double(value))
}

#[distributed_lock(key = "fence:<id>", on_lost = "ignore")]
pub async fn fence(id: u32) -> Result<Option<u64>, AppError> {
    let _ = id;
    Ok(distlock::fencing_token())
}

#[path = "../support/in_process.rs"]
mod in_process;
use in_process::assert_released;

fn main() {
    in_process::run("default", |backend| async move {
        // The end of the body.
        assert_eq!(parse_small("4").await, Ok(8));
        assert_released("parse:4").await;
        assert_eq!(parse_small("40").await, Ok(40));
        assert_released("parse:40").await;
        // `return Ok(…)` and `return Err(…)`.
        assert_eq!(parse_small("0").await, Ok(100));
        assert_released("parse:0").await;
        assert_eq!(parse_small("400").await, Err(AppError::TooLarge));
        assert_released("parse:400").await;
        // `?` on a parse error.
        assert!(matches!(parse_small("x").await, Err(AppError::Parse(_))));
        assert_released("parse:x").await;
        let stats = backend.stats();
        assert_eq!((stats.acquired, stats.released), (5, 5), "{stats:?}");
        assert!(fence(1).await.unwrap().is_some());
        assert!(!distlock::is_held());
    });
}
