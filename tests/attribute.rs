//! `#[distributed_lock]` against real Redis: interruption policies, every way out of the body
//! releasing, reentrancy, multi-key locks, and keys that arguments cannot bend.
//!
//! Each test registers its own backend name (annotated functions name their backend), backed by
//! its own redis-server.

mod common;

use common::{released_within, watch_lock_writes, Fixture, SingleRedis};
use distlock::__private::KeyBuilder;
use distlock::{distributed_lock, Lock, LockError, LostReason, Registry};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
enum TestError {
    Lock(LockError),
    Domain(&'static str),
}

impl From<LockError> for TestError {
    fn from(err: LockError) -> Self {
        TestError::Lock(err)
    }
}

impl TestError {
    fn lost_reason(&self) -> Option<LostReason> {
        match self {
            TestError::Lock(err) => err.lost_reason(),
            TestError::Domain(_) => None,
        }
    }
}

/// Starts a server and registers a backend for it under `name`, with 300 ms watchdog leases.
fn serve(name: &'static str) -> SingleRedis {
    serve_with_ttl(name, Duration::from_millis(300))
}

/// Starts a server and registers a backend for it under `name`, with watchdog leases of `ttl`.
fn serve_with_ttl(name: &'static str, ttl: Duration) -> SingleRedis {
    let fx = SingleRedis::start(|b| b.watchdog_lease(ttl));
    Registry::global()
        .register(name, fx.backend().clone())
        .unwrap();
    fx
}

#[distributed_lock(key = "steps:<id>", lease = "150ms", backend = "checkpoint")]
async fn two_steps_checkpointed(id: u32, steps: &Mutex<Vec<u32>>) -> Result<(), TestError> {
    steps.lock().unwrap().push(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    steps.lock().unwrap().push(2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lost_between_statements_stops_the_body_before_the_next() {
    let _fx = serve("checkpoint");
    let steps = Mutex::new(Vec::new());
    let err = two_steps_checkpointed(1, &steps).await.unwrap_err();
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err:?}");
    assert_eq!(
        *steps.lock().unwrap(),
        [1],
        "the second statement must not run"
    );
}

#[distributed_lock(
    key = "abort:<id>",
    lease = "150ms",
    on_lost = "abort",
    backend = "abort"
)]
async fn one_long_step_aborted(id: u32, steps: &Mutex<Vec<u32>>) -> Result<(), TestError> {
    {
        steps.lock().unwrap().push(1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        steps.lock().unwrap().push(2);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_drops_the_body_at_its_next_await() {
    let _fx = serve("abort");
    let steps = Mutex::new(Vec::new());
    let started = Instant::now();
    let err = one_long_step_aborted(1, &steps).await.unwrap_err();
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err:?}");
    assert_eq!(*steps.lock().unwrap(), [1]);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "dropped mid-await, not after it"
    );
}

#[distributed_lock(
    key = "ignore:<id>",
    lease = "150ms",
    on_lost = "ignore",
    backend = "ignore"
)]
async fn two_steps_ignoring(id: u32, steps: &Mutex<Vec<u32>>) -> Result<(), TestError> {
    steps.lock().unwrap().push(1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    steps.lock().unwrap().push(2);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ignore_runs_to_the_end_and_counts_the_loss() {
    let fx = serve("ignore");
    let steps = Mutex::new(Vec::new());
    two_steps_ignoring(1, &steps).await.unwrap();
    assert_eq!(*steps.lock().unwrap(), [1, 2]);
    assert_eq!(fx.backend().stats().lost_ignored, 1);
}

#[distributed_lock(key = "exit:<how>", backend = "exits")]
async fn leave(how: &str) -> Result<u32, TestError> {
    if how == "return" {
        return Ok(7);
    }
    if how == "question-mark" {
        Err(TestError::Domain("failed"))?;
    }
    if how == "panic" {
        panic!("the body panics");
    }
    if how == "hang" {
        std::future::pending::<()>().await;
    }
    Ok(0)
}

/// The writes to `key`'s lock, watched from before the call that must release it ends. Only a
/// release leaves the marker `released_within` waits for; an expiry leaves no key.
async fn listen_for_release(fx: &SingleRedis, key: &str) -> redis::aio::PubSub {
    watch_lock_writes(&fx.server, &SingleRedis::lock_key(key)).await
}

/// The `exits` backend's lease TTL: long enough that a loaded machine's watchdog does not lose a
/// lease before the body leaves.
const EXITS_TTL: Duration = Duration::from_secs(2);

/// Released, not left to expire: only a release leaves the marker `released_within` waits for
/// (an expiry leaves no key, and a release after it finds nothing to mark). Waited for up to
/// half the TTL, so that a slow background release passes and a lock left to expire fails.
async fn released_not_expired(fx: &SingleRedis, mut writes: redis::aio::PubSub, key: &str) {
    let limit = EXITS_TTL / 2;
    assert!(
        released_within(&fx.server, &mut writes, &SingleRedis::lock_key(key), limit).await,
        "{key} was not released (left to expire?) within {limit:?} of the call's end"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_way_out_of_the_body_releases() {
    let fx = serve_with_ttl("exits", EXITS_TTL);
    let backend = fx.backend();
    // `return`, `?` and the end of the body release before the call returns.
    assert_eq!(leave("return").await.unwrap(), 7);
    assert_eq!(
        fx.pttl("exit:return").await,
        None,
        "released by the time it returned"
    );
    assert!(matches!(
        leave("question-mark").await,
        Err(TestError::Domain("failed"))
    ));
    assert_eq!(fx.pttl("exit:question-mark").await, None);
    assert_eq!(leave("end").await.unwrap(), 0);
    assert_eq!(fx.pttl("exit:end").await, None);

    // A panic and a cancellation release in the background (one round trip later, unless the
    // machine is loaded), before the lock's TTL runs out.
    let listener = listen_for_release(&fx, "exit:panic").await;
    let panicked = tokio::spawn(leave("panic")).await.unwrap_err();
    assert!(panicked.is_panic());
    released_not_expired(&fx, listener, "exit:panic").await;

    let listener = listen_for_release(&fx, "exit:hang").await;
    let hanging = tokio::spawn(leave("hang"));
    let taken = fx
        .server
        .wait_until(Duration::from_secs(5), async || {
            backend.inspect("exit:hang").await.unwrap().is_some()
        })
        .await;
    assert!(taken, "the hanging call never took its lock");
    hanging.abort();
    assert!(hanging.await.unwrap_err().is_cancelled());
    released_not_expired(&fx, listener, "exit:hang").await;
    assert_eq!(distlock::__private::raw::watched_leases(backend), 0);
    // The server has run the release; its reply reaches the background task a moment later.
    distlock::__private::raw::until_local(Duration::from_secs(1), async || {
        backend.stats().released >= 5
    })
    .await;
    let stats = backend.stats();
    assert_eq!(
        (stats.released, stats.release_found_expired),
        (5, 0),
        "{stats:?}"
    );
}

#[distributed_lock(key = "nested:<id>", backend = "nested")]
async fn outer(id: u32) -> Result<(u64, u64), TestError> {
    let mine = distlock::fencing_token().unwrap();
    let inner = inner(id).await?;
    assert!(
        distlock::is_held(),
        "the inner call must not release the outer lock"
    );
    Ok((mine, inner))
}

#[distributed_lock(key = "nested:<id>", backend = "nested")]
async fn inner(id: u32) -> Result<u64, TestError> {
    Ok(distlock::fencing_token().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nested_call_on_a_held_key_reenters() {
    let fx = serve("nested");
    let (outer_token, inner_token) = outer(3).await.unwrap();
    assert_eq!(
        outer_token, inner_token,
        "one acquisition serves both calls"
    );
    assert_eq!(fx.backend().stats().acquired, 1);
    assert_eq!(
        fx.backend().inspect("nested:3").await.unwrap(),
        None,
        "the outer call released"
    );
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], wait = "20s", backend = "transfers")]
async fn transfer(
    balances: &Mutex<HashMap<u32, i64>>,
    from: u32,
    to: u32,
    amount: i64,
) -> Result<(), TestError> {
    let (a, b) = {
        let balances = balances.lock().unwrap();
        (balances[&from], balances[&to])
    };
    tokio::task::yield_now().await;
    let mut balances = balances.lock().unwrap();
    balances.insert(from, a - amount);
    balances.insert(to, b + amount);
    Ok(())
}

#[distributed_lock(keys = ["account:<from>", "account:<to>"], backend = "transfers")]
async fn transfer_now(from: u32, to: u32) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_calls_in_opposite_orders_neither_deadlock_nor_lose_money() {
    let fx = serve("transfers");
    let balances = std::sync::Arc::new(Mutex::new(HashMap::from([(1, 1_000), (2, 1_000)])));
    let mut calls = Vec::new();
    for i in 0..100 {
        let balances = balances.clone();
        let (from, to) = if i % 2 == 0 { (1, 2) } else { (2, 1) };
        calls.push(tokio::spawn(async move {
            transfer(&balances, from, to, i).await
        }));
    }
    for call in calls {
        call.await.unwrap().unwrap();
    }
    {
        let balances = balances.lock().unwrap();
        assert_eq!(balances[&1] + balances[&2], 2_000);
        let expected = 1_000 - (0..100).step_by(2).sum::<i64>() + (1..100).step_by(2).sum::<i64>();
        assert_eq!(balances[&1], expected);
    }

    // All or none: with account 2 held by another client, account 1 is taken, then given back
    // when the server refuses account 2.
    let other = fx.another_backend();
    let held = Lock::new("account:2").on(&other).acquire().await.unwrap();
    let before = fx.backend().stats();
    let err = transfer_now(1, 2).await.unwrap_err();
    assert!(
        matches!(err, TestError::Lock(LockError::Busy { ref key, .. }) if key == "account:2"),
        "{err:?}"
    );
    let after = fx.backend().stats();
    assert_eq!(
        (
            after.acquired - before.acquired,
            after.busy_replies - before.busy_replies,
            after.released - before.released,
        ),
        (1, 1, 1),
        "account:1 acquired, account:2 refused by the server, account:1 released"
    );
    assert_eq!(fx.backend().inspect("account:1").await.unwrap(), None);
    held.release().await.unwrap();
    transfer_now(2, 1).await.unwrap();
}

#[distributed_lock(key = "pair:<left>:<right>", backend = "pairs")]
async fn pair(left: &str, right: &str) -> Result<(), TestError> {
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_cannot_bend_the_key() {
    let fx = serve("pairs");
    let held = Lock::new("pair:a%3Ab:c")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    // ("a:b", "c") renders to the held key; ("a", "b:c") must not.
    pair("a", "b:c").await.unwrap();
    assert!(matches!(
        pair("a:b", "c").await,
        Err(TestError::Lock(LockError::Busy { .. }))
    ));
    held.release().await.unwrap();
    pair("{tag}", "\n").await.unwrap();
}

/// Renders a template `t:<a>:<b>` as the attribute does.
fn render(a: &str, b: &str) -> String {
    KeyBuilder::new()
        .literal("t:")
        .value(&a)
        .literal(":")
        .value(&b)
        .finish()
}

#[test]
fn different_argument_tuples_never_render_the_same_key() {
    const ALPHABET: &[&str] = &[
        "a", "b", ":", "%", "3A", "{", "}", "\n", "\u{0}", "é", "🔒", "-", "_", ".", "@", " ",
        "\u{85}", "",
    ];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut piece = || -> String {
        (0..next() % 4)
            .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
            .collect()
    };
    let mut seen: HashMap<String, (String, String)> = HashMap::new();
    let mut tuples = vec![
        ("a:b".to_owned(), "c".to_owned()),
        ("a".to_owned(), "b:c".to_owned()),
        (String::new(), ":".to_owned()),
        (":".to_owned(), String::new()),
        (String::new(), "3A:".to_owned()),
        (":".to_owned(), "3A".to_owned()),
    ];
    for _ in 0..50_000 {
        tuples.push((piece(), piece()));
    }
    for (a, b) in tuples {
        let key = render(&a, &b);
        assert!(
            !key.contains(['{', '}']) && !key.chars().any(char::is_control),
            "{key:?} has structure from the arguments"
        );
        if let Some(earlier) = seen.insert(key.clone(), (a.clone(), b.clone())) {
            assert_eq!(earlier, (a, b), "two tuples rendered {key:?}");
        }
    }
    assert!(
        seen.len() > 10_000,
        "the generator produced too few distinct tuples: {}",
        seen.len()
    );
}

#[distributed_lock(key = "doc:<id>", mode = "read", backend = "kinds")]
async fn read_doc(id: u32, together: &tokio::sync::Barrier) -> Result<u64, TestError> {
    // Both readers must be inside at once for the barrier to open.
    together.wait().await;
    Ok(distlock::fencing_token().unwrap())
}

#[distributed_lock(key = "doc:<id>", mode = "write", backend = "kinds")]
async fn write_doc(id: u32) -> Result<u64, TestError> {
    Ok(distlock::fencing_token().unwrap())
}

#[distributed_lock(key = "api:<tenant>", permits = 2, backend = "kinds")]
async fn call_api(tenant: &str, together: &tokio::sync::Barrier) -> Result<(), TestError> {
    together.wait().await;
    Ok(())
}

/// `mode = "read"` lets readers in together and keeps writers out; `permits = 2` lets exactly
/// two calls in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_mode_and_permits_share_as_declared() {
    let fx = serve("kinds");
    let both = tokio::sync::Barrier::new(2);
    let read = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::future::join(read_doc(1, &both), read_doc(1, &both)),
    )
    .await
    .expect("two readers were inside together");
    let (first, second) = (read.0.unwrap(), read.1.unwrap());
    assert_eq!(first, second, "readers share the last token");
    assert!(write_doc(1).await.unwrap() > first);

    let reader = Lock::new("doc:2")
        .kind(distlock::LockKind::Read)
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let busy = write_doc(2).await.unwrap_err();
    assert!(
        matches!(busy, TestError::Lock(LockError::Busy { .. })),
        "{busy:?}"
    );
    reader.release().await.unwrap();

    let pair = tokio::sync::Barrier::new(2);
    let (first, second) = tokio::time::timeout(
        Duration::from_secs(5),
        futures_util::future::join(call_api("acme", &pair), call_api("acme", &pair)),
    )
    .await
    .expect("two permits were held together");
    first.unwrap();
    second.unwrap();
    let held: Vec<_> = futures_util::future::join_all((0..2).map(|_| {
        Lock::new("api:acme")
            .kind(distlock::LockKind::Permits(2))
            .on(fx.backend())
            .acquire()
    }))
    .await;
    assert!(held.iter().all(Result::is_ok), "{held:?}");
    let third = call_api("acme", &tokio::sync::Barrier::new(1)).await;
    assert!(
        matches!(third, Err(TestError::Lock(LockError::Busy { .. }))),
        "{third:?}"
    );
}
