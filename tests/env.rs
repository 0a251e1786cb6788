//! Configuration of the `"default"` backend from the environment. One test, in its own binary:
//! the environment is process-wide, and the registry builds "default" once.

use distlock::{Lock, LockError, Registry};
use distlock_test_support::SentinelGroup;
use std::time::Duration;

fn default_backend_error() -> String {
    Registry::global().get("default").unwrap_err().to_string()
}

#[tokio::test]
async fn the_default_backend_comes_from_the_environment() {
    for var in [
        distlock::env::RESPONSE_TIMEOUT,
        distlock::env::CONNECT_TIMEOUT,
        distlock::env::MASTER_TIMEOUT,
        distlock::env::MAX_BACKOFF,
        distlock::env::LOCAL_BATCH,
        distlock::env::MARKER_TTL,
        distlock::env::RENEW_BATCH,
        distlock::env::MAX_KEY_LEN,
        distlock::env::CLOCK_DRIFT_FACTOR,
        distlock::env::URL,
        distlock::env::WATCHDOG_LEASE,
        "DISTLOCK_WATCHDOG_TIMEOUT",
        distlock::env::PREFIX,
        distlock::env::MIN_REPLICAS,
        distlock::env::REPLICA_TIMEOUT,
    ] {
        std::env::remove_var(var);
    }
    let err = Lock::new("k").acquire().await.unwrap_err();
    assert!(
        matches!(&err, LockError::NotConfigured { backend, .. } if backend == "default"),
        "{err:?}"
    );
    assert!(err.to_string().contains("set DISTLOCK_URL"), "{err}");

    std::env::set_var("DISTLOCK_URL", "mongodb://user:hunter2@db/locks");
    let err = default_backend_error();
    assert!(
        err.starts_with("invalid lock configuration: DISTLOCK_URL"),
        "{err}"
    );
    assert!(err.contains("expected redis://"), "{err}");
    assert!(!err.contains("hunter2"), "password leaked: {err}");

    std::env::set_var("DISTLOCK_URL", "memory://");
    std::env::set_var("DISTLOCK_WATCHDOG_LEASE", "10ms");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_WATCHDOG_LEASE is `10ms`; it must be at least 100ms"),
        "{err}"
    );
    std::env::set_var("DISTLOCK_WATCHDOG_LEASE", "a while");
    assert!(default_backend_error()
        .contains("DISTLOCK_WATCHDOG_LEASE is `a while`, which is not a duration"));

    // One name per setting: the watchdog lease's first name is refused, never read or ignored.
    std::env::set_var("DISTLOCK_WATCHDOG_LEASE", "1s");
    std::env::set_var("DISTLOCK_WATCHDOG_TIMEOUT", "1s");
    let err = default_backend_error();
    assert!(
        err.contains(
            "DISTLOCK_WATCHDOG_TIMEOUT is not read; the watchdog lease's variable is \
             DISTLOCK_WATCHDOG_LEASE"
        ),
        "{err}"
    );
    std::env::remove_var("DISTLOCK_WATCHDOG_TIMEOUT");
    std::env::set_var("DISTLOCK_PREFIX", "bad{prefix}");
    assert!(default_backend_error().contains("DISTLOCK_PREFIX is `bad{prefix}`"));
    std::env::remove_var("DISTLOCK_PREFIX");

    std::env::set_var("DISTLOCK_MIN_REPLICAS", "two");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_MIN_REPLICAS is `two`; it must be a whole number"),
        "{err}"
    );
    std::env::set_var("DISTLOCK_MIN_REPLICAS", "1");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_MIN_REPLICAS is 1 for the in-process backend"),
        "{err}"
    );
    std::env::set_var("DISTLOCK_REPLICA_TIMEOUT", "soon");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_REPLICA_TIMEOUT is `soon`, which is not a duration"),
        "{err}"
    );
    std::env::remove_var("DISTLOCK_MIN_REPLICAS");
    std::env::set_var("DISTLOCK_REPLICA_TIMEOUT", "200ms");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_REPLICA_TIMEOUT is set (200ms) but min_replicas is 0"),
        "{err}"
    );
    std::env::remove_var("DISTLOCK_REPLICA_TIMEOUT");
    // Every builder setting has its variable; a bad one is named, whether the variable cannot
    // be read or the builder refuses its value.
    for (name, value, problem) in [
        (
            "DISTLOCK_RESPONSE_TIMEOUT",
            "soon",
            "DISTLOCK_RESPONSE_TIMEOUT is `soon`, which is not a duration",
        ),
        (
            "DISTLOCK_MAX_BACKOFF",
            "0ms",
            "DISTLOCK_MAX_BACKOFF must be at least 1ms",
        ),
        (
            "DISTLOCK_MARKER_TTL",
            "0s",
            "DISTLOCK_MARKER_TTL must be at least 1ms",
        ),
        (
            "DISTLOCK_MASTER_TIMEOUT",
            "50ms",
            "DISTLOCK_MASTER_TIMEOUT is set (50ms) but `memory://`",
        ),
        (
            "DISTLOCK_RENEW_BATCH",
            "0",
            "DISTLOCK_RENEW_BATCH is 0; it must be at least 1",
        ),
        (
            "DISTLOCK_MAX_KEY_LEN",
            "many",
            "DISTLOCK_MAX_KEY_LEN is `many`; it must be a whole number of bytes",
        ),
        (
            "DISTLOCK_CLOCK_DRIFT_FACTOR",
            "0.9",
            "DISTLOCK_CLOCK_DRIFT_FACTOR is 0.9; it must be between 0 and 0.5",
        ),
        (
            "DISTLOCK_FENCING_TOKENS",
            "maybe",
            "DISTLOCK_FENCING_TOKENS is `maybe`; it must be `true` or `false`",
        ),
    ] {
        std::env::set_var(name, value);
        let err = default_backend_error();
        assert!(err.contains(problem), "{name}={value}: {err}");
        std::env::remove_var(name);
    }
    for (name, value) in [
        ("DISTLOCK_RESPONSE_TIMEOUT", "800ms"),
        ("DISTLOCK_CONNECT_TIMEOUT", "2s"),
        ("DISTLOCK_MAX_BACKOFF", "50ms"),
        ("DISTLOCK_LOCAL_BATCH", "0ms"),
        ("DISTLOCK_MARKER_TTL", "10m"),
        ("DISTLOCK_RENEW_BATCH", "64"),
        ("DISTLOCK_MAX_KEY_LEN", "128"),
        ("DISTLOCK_CLOCK_DRIFT_FACTOR", "0.02"),
    ] {
        std::env::set_var(name, value);
    }
    std::env::set_var(
        "DISTLOCK_URL",
        "redis-sentinel://:hunter2@127.0.0.1:1/primary?db=x",
    );
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_URL `redis-sentinel://:***@"),
        "{err}"
    );
    assert!(err.contains("gives `db=x`"), "{err}");

    // A Sentinel group from the environment, every grant acknowledged by the replica; its
    // locks efficiency locks, without tokens.
    let group = SentinelGroup::start(Duration::from_secs(5));
    std::env::set_var("DISTLOCK_URL", group.sentinel_url());
    std::env::set_var("DISTLOCK_MIN_REPLICAS", "1");
    std::env::set_var("DISTLOCK_PREFIX", "from-env");
    std::env::set_var("DISTLOCK_FENCING_TOKENS", "false");
    let server = group.primary();
    let backend = Registry::global().get("default").unwrap();
    assert_eq!((backend.name(), backend.prefix()), ("default", "from-env"));
    assert_eq!(backend.watchdog_lease(), std::time::Duration::from_secs(1));
    let guard = Lock::new("order:1").acquire().await.unwrap();
    assert_eq!(
        guard.fencing_token(),
        0,
        "an efficiency lock, from the environment"
    );
    let ttl = server
        .command(&["PTTL", "from-env:{order:1}"])
        .as_int()
        .unwrap();
    assert!(
        (1..=1000).contains(&ttl),
        "the 1s watchdog lease is on the server: {ttl}"
    );
    assert!(
        group.replica().command(&["EXISTS", "from-env:{order:1}"])
            == distlock_test_support::Reply::Int(1),
        "the grant was acknowledged by the replica before the call returned"
    );
    guard.release().await.unwrap();
}
