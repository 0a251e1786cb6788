//! Shared by the `ui/pass` cases that run: an in-process backend to run on, and checks of the
//! keys a call holds. Included with `#[path]`; each case uses what it needs.
#![allow(dead_code)]

use distlock::{Backend, Registry};
use std::future::Future;

/// Registers an in-process backend under `name` and runs `body` with it on a current-thread
/// runtime.
pub fn run<F: Future>(name: &str, body: impl FnOnce(Backend) -> F) -> F::Output {
    let backend = Backend::in_process();
    Registry::global().register(name, backend.clone()).unwrap();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(body(backend))
}

/// Inside a locked call on the `"default"` backend: `key` is the lock this call holds.
pub async fn assert_holds(key: &str) {
    let backend = Registry::global().get("default").unwrap();
    let holder = backend
        .inspect(key)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("the call does not hold `{key}`"));
    assert_eq!(Some(holder.fencing_token), distlock::fencing_token());
}

/// After a call on the `"default"` backend: its lock `key` is released (the in-process backend
/// releases before the call returns).
pub async fn assert_released(key: &str) {
    let backend = Registry::global().get("default").unwrap();
    assert_eq!(
        backend.inspect(key).await.unwrap(),
        None,
        "`{key}` is still held after the call returned"
    );
}
