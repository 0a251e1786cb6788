//! A process that stops releases its locks at once: `Backend::shutdown` refuses new locks (waiters
//! included), tells every running body its lease is ending, and releases every lease — 100 of
//! them in a few round trips — and it returns within its bound when the server is unreachable.

use distlock::{Backend, Lease, Lock, LockError, LostReason, Released, SHUTDOWN_TIMEOUT};
use distlock_test_support::{FaultProxy, RedisServer};
use std::time::{Duration, Instant};

const LOCKS: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_holding_100_locks_shuts_down_and_frees_them_at_once() {
    let server = RedisServer::start();
    let backend = Backend::builder(server.url()).build().unwrap();
    let other = Backend::builder(server.url()).build().unwrap();

    // 100 calls holding their locks (watchdog leases: 30 s TTL), each body waiting for its
    // lease to end.
    let mut bodies = Vec::new();
    for i in 0..LOCKS {
        let guard = Lock::new(format!("job:{i}"))
            .on(&backend)
            .acquire()
            .await
            .unwrap();
        bodies.push(tokio::spawn(async move {
            let lost = guard.lost().await;
            (lost.lost_reason(), guard.release().await)
        }));
    }
    // A waiter in this process queued behind a held key, and one waiting on the server for a
    // key another process holds: both are refused when the backend shuts down.
    let local_waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            Lock::new("job:0")
                .on(&backend)
                .wait_forever()
                .acquire()
                .await
        })
    };
    let theirs = Lock::new("theirs").on(&other).acquire().await.unwrap();
    let server_waiter = {
        let backend = backend.clone();
        tokio::spawn(async move {
            Lock::new("theirs")
                .on(&backend)
                .wait_forever()
                .acquire()
                .await
        })
    };
    // The server waiter subscribed to the key's release channel: its notification link is open.
    let subscribed = server
        .wait_until(Duration::from_secs(5), async || {
            server.subscribers("distlock:{theirs}:released") == 1
        })
        .await;
    assert!(subscribed, "the server waiter never subscribed");

    let started = Instant::now();
    backend.shutdown().await.unwrap();
    let took = started.elapsed();

    // Every key is free now, not after its TTL.
    let held = other.list("job:*").await.unwrap();
    assert!(
        held.is_empty(),
        "{} keys still held after shutdown",
        held.len()
    );
    for body in bodies {
        let (reason, released) = body.await.unwrap();
        assert_eq!(reason, Some(LostReason::ShutDown));
        assert_eq!(released.unwrap(), Released::Released);
    }
    for waiter in [local_waiter, server_waiter] {
        let refused = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("a waiter kept waiting after the shutdown")
            .unwrap()
            .unwrap_err();
        assert!(matches!(refused, LockError::ShutDown { .. }), "{refused:?}");
    }
    let refused = Lock::new("job:new")
        .on(&backend)
        .acquire()
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("is shut down and takes no new locks"),
        "{refused}"
    );
    // The other process's lock is untouched.
    assert!(theirs.is_held());
    theirs.release().await.unwrap();
    // Idempotent.
    backend.shutdown().await.unwrap();
    let stats = backend.stats();
    assert_eq!(stats.left_to_expire, 0, "{stats:?}");
    eprintln!("shutdown with {LOCKS} locks held: {took:?}, keys left held: 0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_returns_within_its_bound_when_the_server_is_unreachable() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.addr()).await;
    let backend = Backend::builder(proxy.url()).build().unwrap();
    let mut guards = Vec::new();
    for i in 0..10 {
        let guard = Lock::new(format!("k:{i}"))
            .on(&backend)
            .lease(Lease::Fixed(Duration::from_secs(5)))
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    proxy.blackhole(true);
    let started = Instant::now();
    let err = backend.shutdown().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took < SHUTDOWN_TIMEOUT + Duration::from_millis(500),
        "shutdown took {took:?} with the server unreachable"
    );
    assert!(
        err.to_string().contains("10 of 10 locks were not released"),
        "{err}"
    );
    assert_eq!(backend.stats().left_to_expire, 10);
    assert!(guards.iter().all(|guard| !guard.is_held()));
    eprintln!("shutdown, server unreachable: {took:?}: {err}");
}
