//! Backends for users' tests: two tests in one binary, each with its own `"default"`
//! (`distlock::testing::scope`), neither collide in the registry nor share locks — as a user's
//! test file would run them, on the in-process backend (`memory://`), no server needed.

use distlock::{distributed_lock, Backend, Lease, Lock, LockError};
use std::time::Duration;

#[distributed_lock(key = "invoice:<id>", wait = "0s")]
async fn bill(id: u64) -> Result<u64, LockError> {
    Ok(id * 100)
}

/// Holds `invoice:1` on this test's own default backend while the locked call runs: on a shared
/// backend the other test's call would be refused now and then; here it never is.
#[tokio::test]
async fn first_test_with_its_own_default() {
    let backend = Backend::in_process();
    distlock::testing::scope(backend.clone(), async {
        let held = Lock::new("invoice:1").acquire().await.unwrap();
        assert!(matches!(bill(1).await, Err(LockError::Busy { .. })));
        held.release().await.unwrap();
        assert_eq!(bill(1).await.unwrap(), 100);
    })
    .await;
    assert_eq!(backend.stats().acquired, 2, "{:?}", backend.stats());
}

#[tokio::test]
async fn second_test_with_its_own_default() {
    let backend = Backend::in_process();
    for _ in 0..50 {
        let billed = distlock::testing::scope(backend.clone(), bill(1)).await;
        assert_eq!(
            billed.unwrap(),
            100,
            "the other test's lock leaked into this one"
        );
    }
    assert_eq!(backend.stats().acquired, 50);
    // Outside the scope, nothing is registered in this binary.
    assert!(matches!(
        bill(1).await,
        Err(LockError::NotConfigured { .. })
    ));
}

/// Scopes nest, name other backends too, and do not reach spawned tasks (tokio task-locals).
#[tokio::test]
async fn scopes_nest_and_stay_in_their_task() {
    let outer = Backend::in_process();
    let jobs = Backend::in_process();
    distlock::testing::scope(outer.clone(), async {
        distlock::testing::scope_as("jobs", jobs.clone(), async {
            let _default = Lock::new("a").acquire().await.unwrap();
            let _jobs = Lock::new("b").backend("jobs").acquire().await.unwrap();
            let spawned = tokio::spawn(async { Lock::new("c").acquire().await.map(drop) });
            assert!(matches!(
                spawned.await.unwrap(),
                Err(LockError::NotConfigured { .. })
            ));
        })
        .await;
    })
    .await;
    assert_eq!((outer.stats().acquired, jobs.stats().acquired), (1, 1));
}

/// `tokio::time::pause()` with the in-process backend: leases are measured on the real clock
/// (as the servers measure theirs), so paused time neither expires nor renews them — a test
/// that wants a lease to run out uses a short real lease, as here.
#[tokio::test(start_paused = true)]
async fn paused_time_leaves_leases_alone() {
    let backend = Backend::in_process();
    let guard = Lock::new("paused")
        .on(&backend)
        .lease(Lease::Fixed(Duration::from_millis(200)))
        .acquire()
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert!(
        guard.is_held(),
        "an hour of paused time expired a 200 ms lease"
    );
    let lost = guard.lost().await;
    assert!(lost.is_lost(), "{lost:?}");
}
