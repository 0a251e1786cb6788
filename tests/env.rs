//! Configuration of the `"default"` backend from the environment. One test, in its own binary:
//! the environment is process-wide, and the registry builds "default" once.

use distlock::{Lock, LockError, Registry};
use distlock_test_support::RedisServer;

fn default_backend_error() -> String {
    Registry::global().get("default").unwrap_err().to_string()
}

#[tokio::test]
async fn the_default_backend_comes_from_the_environment() {
    for var in [
        distlock::ENV_URL,
        distlock::ENV_WATCHDOG_TIMEOUT,
        distlock::ENV_PREFIX,
    ] {
        std::env::remove_var(var);
    }
    let err = Lock::new("k").acquire().await.unwrap_err();
    assert!(
        matches!(&err, LockError::NotConfigured { backend, .. } if backend == "default"),
        "{err:?}"
    );
    assert!(err.to_string().contains("set DISTLOCK_URL"), "{err}");

    std::env::set_var("DISTLOCK_URL", "postgres://user:hunter2@db/locks");
    let err = default_backend_error();
    assert!(
        err.starts_with("invalid lock configuration: DISTLOCK_URL"),
        "{err}"
    );
    assert!(err.contains("expected redis://"), "{err}");
    assert!(!err.contains("hunter2"), "password leaked: {err}");

    std::env::set_var("DISTLOCK_URL", "memory://");
    std::env::set_var("DISTLOCK_WATCHDOG_TIMEOUT", "10ms");
    let err = default_backend_error();
    assert!(
        err.contains("DISTLOCK_WATCHDOG_TIMEOUT is `10ms`; it must be at least 100ms"),
        "{err}"
    );
    std::env::set_var("DISTLOCK_WATCHDOG_TIMEOUT", "a while");
    assert!(default_backend_error()
        .contains("DISTLOCK_WATCHDOG_TIMEOUT is `a while`, which is not a duration"));

    std::env::set_var("DISTLOCK_WATCHDOG_TIMEOUT", "1s");
    std::env::set_var("DISTLOCK_PREFIX", "bad{prefix}");
    assert!(default_backend_error().contains("DISTLOCK_PREFIX is `bad{prefix}`"));

    let server = RedisServer::start();
    std::env::set_var("DISTLOCK_URL", server.url());
    std::env::set_var("DISTLOCK_PREFIX", "from-env");
    let backend = Registry::global().get("default").unwrap();
    assert_eq!((backend.name(), backend.prefix()), ("default", "from-env"));
    assert_eq!(
        backend.watchdog_timeout(),
        std::time::Duration::from_secs(1)
    );
    let guard = Lock::new("order:1").acquire().await.unwrap();
    let ttl = server
        .command(&["PTTL", "from-env:{order:1}"])
        .as_int()
        .unwrap();
    assert!(
        (1..=1000).contains(&ttl),
        "the 1s watchdog lease is on the server: {ttl}"
    );
    guard.release().await.unwrap();
}
