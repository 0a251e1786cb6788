//! Releasing with `SET … IFEQ` where the server has it (Valkey ≥ 8.1, Redis ≥ 8.4), the script
//! everywhere else: a lock granted on the first try is released by one conditional write; one
//! that was waited on goes through `release.lua`, which wakes its waiters; a server without
//! `IFEQ` is asked once per connection and then never again; a key whose conditional write found
//! it waited on is released by script for a while.
//!
//! The server's own command counters (`INFO commandstats`) tell which path ran: `acquire.lua`
//! and `release.lua` each read the key once (`GET`), the conditional write does not.

mod common;

use common::{command_calls, until_waited_on, Fixture, SingleRedis, Valkey, PREFIX};
use distlock::{Backend, Lock, Released};
use distlock_test_support::{RedisServer, ServerConfig};
use std::time::Duration;

/// `(calls, rejected + failed calls)` of `command` on `server`.
fn calls_and_errors(server: &RedisServer, command: &str) -> (u64, u64) {
    let info = server.command(&["INFO", "commandstats"]).as_str().unwrap();
    let prefix = format!("cmdstat_{command}:");
    let Some(line) = info.lines().find_map(|line| line.strip_prefix(&prefix)) else {
        return (0, 0);
    };
    let field = |name: &str| -> u64 {
        line.split(',')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('='))
            .map_or(0, |value| value.parse().unwrap())
    };
    (
        field("calls"),
        field("rejected_calls") + field("failed_calls"),
    )
}

/// `cycles` acquire-and-release cycles of distinct keys, one after another; every release must
/// report the lock released.
async fn cycles(backend: &Backend, test: &str, cycles: usize) {
    for i in 0..cycles {
        let guard = Lock::new(format!("{test}:{i}"))
            .on(backend)
            .acquire()
            .await
            .unwrap();
        assert_eq!(guard.release().await.unwrap(), Released::Released);
    }
}

#[tokio::test]
async fn valkey_releases_a_first_try_grant_with_one_conditional_write() {
    let fx = Valkey::start(|b| b);
    cycles(fx.backend(), "warm", 1).await;
    let gets = command_calls(&fx.server, "get");
    let evals = command_calls(&fx.server, "evalsha");
    cycles(fx.backend(), "quiet", 20).await;
    assert_eq!(
        command_calls(&fx.server, "get") - gets,
        20,
        "only the acquires read the key: no release ran the script"
    );
    assert_eq!(command_calls(&fx.server, "evalsha") - evals, 20);

    // What the conditional write leaves is the script's token marker: the next token is larger.
    let guard = Lock::new("marker")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let token = guard.fencing_token();
    guard.release().await.unwrap();
    let value = fx
        .server
        .command(&["GET", &SingleRedis::lock_key("marker")]);
    assert_eq!(value.as_str().unwrap(), format!("F{token}"));
    let next = Lock::new("marker")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    assert!(next.fencing_token() > token);
    next.release().await.unwrap();

    // Concurrent releases go out as one batch of conditional writes.
    let gets = command_calls(&fx.server, "get");
    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let backend = fx.backend().clone();
            tokio::spawn(async move {
                let guard = Lock::new(format!("many:{i}"))
                    .on(&backend)
                    .acquire()
                    .await
                    .unwrap();
                guard.release().await.unwrap()
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), Released::Released);
    }
    assert_eq!(command_calls(&fx.server, "get") - gets, 50);
}

#[tokio::test]
async fn a_lock_waited_on_is_released_by_the_script_which_wakes_the_waiter() {
    let fx = Valkey::start(|b| b);
    let other = fx.contender();
    let guard = Lock::new("waited")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let waiter = common::spawn_waiter(&other, "waited", Duration::from_secs(10));
    until_waited_on(&fx, "waited").await;
    let published = command_calls(&fx.server, "publish");
    let (_, set_errors) = calls_and_errors(&fx.server, "set");
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(
        command_calls(&fx.server, "publish") - published,
        1,
        "the conditional write found the lock waited on, and the script announced the release"
    );
    waiter.await.unwrap().unwrap();
    assert_eq!(calls_and_errors(&fx.server, "set").1, set_errors);

    // The key is remembered as contended for a moment: its next release goes to the script at
    // once (which reads the key), instead of a conditional write likely to miss again.
    let gets = command_calls(&fx.server, "get");
    let again = Lock::new("waited")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.release().await.unwrap(), Released::Released);
    assert_eq!(command_calls(&fx.server, "get") - gets, 2);
}

#[tokio::test]
async fn redlock_over_valkey_masters_release_by_conditional_write() {
    let masters = RedisServer::start_many_with(3, &ServerConfig::new().valkey());
    let urls: Vec<String> = masters.iter().map(RedisServer::url).collect();
    let backend = Backend::redlock(urls).prefix(PREFIX).build().unwrap();
    cycles(&backend, "warm", 1).await;
    let reads = || -> u64 { masters.iter().map(|m| command_calls(m, "get")).sum() };
    // Counted around each release alone (the acquire scripts and the token's write-back read the
    // key too). The token is the second-lowest of the three votes; a master whose vote was the
    // token, or whose write-back was confirmed before the grant, holds exactly the granted value
    // and is released by one conditional write, which reads nothing. At least one master per
    // grant does: the token's own voter, or a quorum of confirmed write-backs. The others — a
    // master whose vote ran past the token (a millisecond boundary between the masters' clocks,
    // common on a loaded machine), or whose write-back was still in flight — run the script,
    // which reads the key once. Releases all by script would read it 3 times per cycle.
    for i in 0..20 {
        let guard = Lock::new(format!("quorum:{i}"))
            .on(&backend)
            .acquire()
            .await
            .unwrap();
        let before = reads();
        assert_eq!(guard.release().await.unwrap(), Released::Released);
        let read = reads() - before;
        assert!(
            read <= 2,
            "cycle {i}: the release read the key on {read} of 3 masters: none released it by \
             conditional write"
        );
    }
}

#[tokio::test]
async fn a_server_without_ifeq_is_asked_once_and_then_released_by_script() {
    let fx = SingleRedis::start(|b| b);
    let (_, errors_before) = calls_and_errors(&fx.server, "set");
    let gets = command_calls(&fx.server, "get");
    cycles(fx.backend(), "old", 10).await;
    let (_, errors) = calls_and_errors(&fx.server, "set");
    assert_eq!(
        errors - errors_before,
        1,
        "one refused SET … IFEQ on the connection, then scripts only"
    );
    assert_eq!(
        command_calls(&fx.server, "get") - gets,
        20,
        "every acquire and every release ran its script"
    );
}
