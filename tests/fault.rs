//! Faults between the client and one real Redis: lost replies, restarts, partitions, unreachable
//! servers, and bad configuration.

mod common;

use common::cell::read_cell;
use common::{released_within, through_proxy, watch_lock_writes, Fixture, SingleRedis};
use distlock::{Backend, Lock, LockError, LostReason, Released};
use distlock_test_support::{free_port, FaultProxy, RedisServer};
use std::time::{Duration, Instant};

/// The token the server records for `key`, held or free.
fn recorded_token(server: &RedisServer, key: &str) -> u64 {
    read_cell(server, &SingleRedis::lock_key(key))
        .token()
        .expect("the key records a token")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_is_retried_into_the_same_grant() {
    let server = RedisServer::start();
    let (proxy, backend) = through_proxy(&server, |b| b).await;
    proxy.drop_next_reply();
    let started = Instant::now();
    let guard = Lock::new("lost-reply")
        .on(&backend)
        .acquire()
        .await
        .expect("the retry succeeds");
    assert_eq!(proxy.dropped().await, 1, "the first reply was lost");
    assert!(
        started.elapsed() < backend.watchdog_lease() / 2,
        "no wait for our own lock"
    );
    assert_eq!(backend.stats().busy, 0, "never saw itself as busy");
    assert_eq!(
        recorded_token(&server, "lost-reply"),
        guard.fencing_token(),
        "exactly one token was issued: the retry got the first grant's token"
    );
    let holder = backend.inspect("lost-reply").await.unwrap().unwrap();
    assert_eq!(holder.fencing_token, guard.fencing_token());
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_reply_leaves_no_lock_and_no_error() {
    let server = RedisServer::start();
    let (proxy, backend) = through_proxy(&server, |b| b).await;
    let guard = Lock::new("lost-release")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    proxy.drop_next_reply();
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(proxy.dropped().await, 1);
    assert!(!read_cell(&server, &SingleRedis::lock_key("lost-release")).is_held());
    let stats = backend.stats();
    assert_eq!(
        (stats.released, stats.release_found_expired),
        (2, 0),
        "{stats:?}"
    );
}

/// A release request lost on its way — held by a partition, then its connection reset, so it
/// never reached the server: the client cannot know that, retries on a new connection, and the
/// key is free within a second, not after its 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_request_is_retried_and_frees_the_key_at_once() {
    let server = RedisServer::start();
    let (proxy, backend) =
        through_proxy(&server, |b| b.response_timeout(Duration::from_millis(200))).await;
    let guard = Lock::new("lost-request")
        .on(&backend)
        .acquire()
        .await
        .unwrap();
    let lock_key = SingleRedis::lock_key("lost-request");
    proxy.blackhole(true);
    let started = Instant::now();
    let release = tokio::spawn(guard.release());
    assert!(
        proxy.until_requests_held(1, Duration::from_secs(5)).await,
        "the release request never reached the proxy"
    );
    // The request dies with its connection (the retry, on a new one, is held again).
    proxy.reset_all();
    assert!(
        read_cell(&server, &lock_key).is_held(),
        "the lost request never ran"
    );
    proxy.blackhole(false);
    let outcome = release.await.unwrap();
    let took = started.elapsed();
    assert_eq!(outcome.unwrap(), Released::Released);
    assert!(!read_cell(&server, &lock_key).is_held());
    assert!(took < Duration::from_secs(1), "freed after {took:?}");
}

/// Three acquire replies lost in a row: the acquire gives up with an ambiguous error, and the
/// lock the requests did take is released in the background with their owner token — within a
/// second, not after the 30 s TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_lost_acquire_replies_leave_no_lock_behind() {
    let server = RedisServer::start();
    let (proxy, backend) = through_proxy(&server, |b| b).await;
    // Watch the key's writes on the server itself, past the proxy. (Nobody waits on the key, so
    // the release does not publish on its channel.)
    let lock_key = SingleRedis::lock_key("orphan");
    let mut writes = watch_lock_writes(&server, &lock_key).await;
    // A granted acquire answers `*2 :1 :<token>`; lose three of them.
    for _ in 0..MAX_FAILED_ATTEMPTS {
        proxy.drop_next_reply_matching(b"*2\r\n:1\r\n", true);
    }
    let started = Instant::now();
    let err = Lock::new("orphan")
        .on(&backend)
        .acquire()
        .await
        .unwrap_err();
    let LockError::Backend(failure) = &err else {
        panic!("expected a backend error, got {err:?}")
    };
    assert!(failure.is_ambiguous(), "{err}");
    assert_eq!(proxy.dropped().await, MAX_FAILED_ATTEMPTS);
    let left = Duration::from_secs(1).saturating_sub(started.elapsed());
    assert!(
        released_within(&server, &mut writes, &lock_key, left).await,
        "the orphaned lock was not released within 1 s"
    );
    assert_eq!(backend.stats().background_releases, 1);
}

/// The acquire script gives up after this many failed round trips in a row.
const MAX_FAILED_ATTEMPTS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_work_again_after_the_server_restarts() {
    let mut fx = SingleRedis::start(|b| b);
    let before = Lock::new("restarted")
        .on(fx.backend())
        .run(async { distlock::fencing_token().unwrap() })
        .await
        .unwrap();
    fx.server.restart();
    assert!(
        fx.server
            .command(&["GET", &SingleRedis::lock_key("restarted")])
            .is_nil(),
        "the restart (no persistence) lost the token marker"
    );
    let backend = fx.backend().clone();
    let guard = Lock::new("restarted")
        .on(&backend)
        .acquire()
        .await
        .expect("reconnects and reloads the script");
    assert!(
        guard.fencing_token() > before,
        "tokens keep increasing across a restart that lost the counter: {} after {before}",
        guard.fencing_token()
    );
    guard.release().await.unwrap();
}

/// An acquire that must fail, and within a bounded time.
async fn fails_soon(backend: &Backend, key: &str) -> LockError {
    let started = Instant::now();
    let err = Lock::new(key).on(backend).acquire().await.unwrap_err();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "took {took:?}");
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_a_backend_error_soon() {
    let port = free_port();
    let backend = Backend::builder(format!("redis://127.0.0.1:{port}"))
        .connect_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = fails_soon(&backend, "nobody-home").await;
    let LockError::Backend(failure) = &err else {
        panic!("expected Backend, got {err:?}")
    };
    assert_eq!(failure.operation(), distlock::Operation::Acquire);
    assert!(
        err.to_string().starts_with(&format!(
            "backend `redis://127.0.0.1:{port}` failed during acquire"
        )),
        "an unregistered backend is named by where it is: {err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partitioned_server_is_a_backend_error_soon() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    proxy.blackhole(true);
    let backend = Backend::builder(proxy.url())
        .connect_timeout(Duration::from_millis(200))
        .response_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let err = fails_soon(&backend, "partitioned").await;
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
}

/// A server that stops answering on a live connection (its requests held by a partition): the
/// call fails with a backend error within a few response timeouts, never waits for an answer
/// that does not come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_stops_answering_is_a_backend_error_soon() {
    let server = RedisServer::start();
    let (proxy, backend) = through_proxy(&server, |b| {
        b.connect_timeout(Duration::from_millis(200))
            .response_timeout(Duration::from_millis(200))
    })
    .await;
    proxy.blackhole(true);
    let started = Instant::now();
    let attempt = Lock::new("silent").on(&backend).acquire();
    let outcome = tokio::time::timeout(Duration::from_secs(10), attempt).await;
    let took = started.elapsed();
    let err = outcome
        .unwrap_or_else(|_| panic!("no answer after {took:?}: the call still waits"))
        .unwrap_err();
    assert!(matches!(err, LockError::Backend(_)), "{err:?}");
    proxy.blackhole(false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_lease_loses_it() {
    let server = RedisServer::start();
    let ttl = Duration::from_millis(400);
    let (proxy, backend) = through_proxy(&server, |b| {
        b.watchdog_lease(ttl)
            .response_timeout(Duration::from_millis(100))
    })
    .await;
    let guard = Lock::new("partition").on(&backend).acquire().await.unwrap();
    proxy.blackhole(true);
    let lost = guard.lost().await;
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost:?}");
    assert!(guard.check().is_err());
    proxy.blackhole(false);
}

#[tokio::test]
async fn malformed_urls_name_the_problem_without_the_password() {
    let err = Backend::builder("redis://user:hunter2@[::1")
        .build()
        .unwrap_err();
    let text = err.to_string();
    assert!(
        text.starts_with("invalid lock configuration: url"),
        "{text}"
    );
    assert!(!text.contains("hunter2"), "password leaked: {text}");
    let err = Backend::builder("http://127.0.0.1:6379")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("is not a lock backend URL; expected redis://"),
        "{err}"
    );
    let err = Backend::builder("no scheme")
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("not a lock backend URL"), "{err}");
}

#[tokio::test]
async fn an_unregistered_backend_is_not_configured() {
    let err = Lock::new("k")
        .backend("billing")
        .acquire()
        .await
        .unwrap_err();
    let LockError::NotConfigured { backend, .. } = &err else {
        panic!("{err:?}")
    };
    assert_eq!(backend, "billing");
    assert!(
        err.to_string().contains("register(\"billing\", backend)"),
        "{err}"
    );
}

#[tokio::test]
async fn invalid_builder_settings_are_rejected() {
    for (builder, needle) in [
        (
            Backend::in_process_builder().watchdog_lease(Duration::ZERO),
            "watchdog_lease is 0s",
        ),
        (Backend::in_process_builder().prefix(""), "prefix is empty"),
        (
            Backend::in_process_builder().prefix("a{b"),
            "prefix `a{b` contains '{'",
        ),
        (
            Backend::in_process_builder().max_key_len(0),
            "max_key_len is 0",
        ),
    ] {
        let err = builder.build().unwrap_err().to_string();
        assert!(err.contains(needle), "{err} lacks {needle}");
    }
    let short = Lock::new("k")
        .on(&Backend::in_process())
        .lease(distlock::Lease::Fixed(Duration::from_millis(99)))
        .acquire()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        short.contains("lease is 99ms; a lease must be at least 100ms"),
        "{short}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_doctor_names_settings_that_weaken_locks() {
    let risky = RedisServer::start_with(
        distlock_test_support::ServerConfig::new().arg("maxmemory-policy", "allkeys-lru"),
    );
    let backend = Backend::builder(risky.url()).build().unwrap();
    let findings = backend.doctor().await.unwrap();
    let checks: Vec<_> = findings.iter().map(|finding| finding.check).collect();
    assert_eq!(
        checks,
        [distlock::Check::Eviction, distlock::Check::Persistence],
        "{findings:?}"
    );
    assert!(findings[0]
        .to_string()
        .contains("maxmemory-policy is `allkeys-lru`"));

    let safe = RedisServer::start_with(
        distlock_test_support::ServerConfig::new().arg("appendonly", "yes"),
    );
    let backend = Backend::builder(safe.url()).build().unwrap();
    assert_eq!(backend.doctor().await.unwrap(), []);
    assert_eq!(Backend::in_process().doctor().await.unwrap(), []);
}

/// A lock key that another program wrote (or an older distlock's hash) is an error that says so,
/// and the value is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_key_written_by_another_program_is_an_error_that_says_so() {
    let fx = SingleRedis::start(|b| b);
    let (string_key, hash_key) = (
        SingleRedis::lock_key("foreign-string"),
        SingleRedis::lock_key("foreign-hash"),
    );
    fx.server.command(&["SET", &string_key, "hello"]);
    fx.server
        .command(&["HSET", &hash_key, "owner", "x", "fence", "1"]);
    for (key, expected) in [
        ("foreign-string", "holds a value distlock did not write"),
        ("foreign-hash", "holds a value distlock did not write"),
    ] {
        let err = Lock::new(key).on(fx.backend()).acquire().await.unwrap_err();
        let message = err.to_string();
        assert!(
            matches!(err, LockError::Backend(_)) && message.contains(expected),
            "{key}: {message}"
        );
        assert!(
            message.contains("prefix"),
            "{key}: names the way out: {message}"
        );
    }
    assert_eq!(
        fx.server.command(&["GET", &string_key]).as_str().as_deref(),
        Some("hello")
    );
    assert_eq!(
        fx.server
            .command(&["HGET", &hash_key, "owner"])
            .as_str()
            .as_deref(),
        Some("x")
    );
}
