//! Lock kinds on every backend: read/write locks (many readers or one writer, writers first)
//! and semaphores (at most N holders), each holder with its own lease. On Redlock a permit is
//! one of N exclusive slots (`engines/redis/redlock/permits.rs`): its token orders grants within a
//! slot only, and the semaphore's own key shows nothing to inspect.

use super::{assert_later_token, unique_key, within};
use crate::common::{until, until_waited_on, Fixture};
use distlock::{Lease, Lock, LockError, LockKind, Released};
use std::time::{Duration, Instant};

fn read(key: &str) -> Lock {
    Lock::new(key).kind(LockKind::Read)
}

pub(crate) async fn readers_share_and_writers_exclude<F: Fixture>() {
    let fx = F::start(|b| b);
    let other = fx.contender();
    let key = unique_key("rw");
    let first = read(&key).on(fx.backend()).acquire().await.unwrap();
    // Readers of this process do not queue behind each other; another process's neither.
    let second = read(&key).on(fx.backend()).acquire().await.unwrap();
    let third = read(&key).on(&other).acquire().await.unwrap();
    let holder = fx
        .backend()
        .inspect(&key)
        .await
        .unwrap()
        .expect("read-held");
    assert_eq!(holder.shared, Some(3), "{holder:?}");
    assert_eq!(holder.owner, "", "a shared lock has no single owner");

    let writer = Lock::new(&key).on(&other).acquire().await.unwrap_err();
    assert!(writer.is_busy(), "{writer:?}");
    for guard in [first, second, third] {
        assert_eq!(guard.release().await.unwrap(), Released::Released);
    }
    let writer = Lock::new(&key).on(&other).acquire().await.unwrap();
    let reader = read(&key).on(fx.backend()).acquire().await.unwrap_err();
    assert!(reader.is_busy(), "a writer excludes readers: {reader:?}");
    writer.release().await.unwrap();
    assert_eq!(fx.backend().inspect(&key).await.unwrap(), None);
}

/// Writer-preferring: once a writer waits, a new reader queues behind it, and the writer gets
/// the lock when the readers ahead of it leave.
pub(crate) async fn a_waiting_writer_holds_new_readers_back<F: Fixture>() {
    let fx = F::start(|b| b);
    let other = fx.contender();
    let key = unique_key("writer-first");
    let reader = read(&key).on(fx.backend()).acquire().await.unwrap();
    let writer = {
        let other = other.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let guard = Lock::new(&key)
                .on(&other)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            (guard.fencing_token(), Instant::now(), guard)
        })
    };
    until_waited_on(&fx, &key).await;
    let late = read(&key).on(&other).acquire().await.unwrap_err();
    assert!(
        late.is_busy(),
        "a new reader queues behind the waiting writer: {late:?}"
    );
    let late_waiter = {
        let key = key.clone();
        let backend = fx.contender();
        tokio::spawn(async move {
            let guard = read(&key)
                .on(&backend)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap();
            (guard.fencing_token(), Instant::now(), guard)
        })
    };
    let reader_token = reader.fencing_token();
    reader.release().await.unwrap();
    let (writer_token, writer_at, writer_guard) =
        within(Duration::from_secs(5), writer).await.unwrap();
    assert_later_token(&fx, writer_token, reader_token);
    writer_guard.release().await.unwrap();
    let (late_token, late_at, late_guard) =
        within(Duration::from_secs(5), late_waiter).await.unwrap();
    assert!(late_at >= writer_at, "the writer went first");
    assert!(
        late_token >= writer_token,
        "a reader's token is the last writer's: {late_token} < {writer_token}"
    );
    late_guard.release().await.unwrap();
}

/// A reader's token is the last token issued, so a writer granted after it has a larger one: a
/// fenced resource rejects the reader's late write-back once the newer writer wrote.
pub(crate) async fn reader_tokens_sit_between_writers<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("tokens");
    let before = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let before_token = before.fencing_token();
    before.release().await.unwrap();
    let reader = read(&key).on(fx.backend()).acquire().await.unwrap();
    assert!(reader.fencing_token() >= before_token);
    let reader_token = reader.fencing_token();
    reader.release().await.unwrap();
    let after = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    assert_later_token(&fx, after.fencing_token(), reader_token);
    after.release().await.unwrap();

    // A writer whose lease ran out (stalled, never released): a reader after it gets a larger
    // token, so the stalled writer's late write is rejected once the reader writes back.
    let stalled = Lock::new(&key)
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    let stalled_token = stalled.fencing_token();
    let reader = read(&key)
        .on(fx.backend())
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    assert!(
        reader.fencing_token() > stalled_token,
        "{} <= {stalled_token}",
        reader.fencing_token()
    );
    reader.release().await.unwrap();
    drop(stalled);
}

pub(crate) async fn a_semaphore_admits_exactly_its_permits<F: Fixture>() {
    let fx = F::start(|b| b);
    let other = fx.contender();
    let key = unique_key("permits");
    let permit = || Lock::new(&key).kind(LockKind::Permits(3));
    // Redlock's permits are slots, each an exclusive lock with its own tokens, and the
    // semaphore's own key holds nothing to inspect.
    let slots = fx.kind() == "redlock";
    let first = permit().on(fx.backend()).acquire().await.unwrap();
    let second = permit().on(fx.backend()).acquire().await.unwrap();
    let third = permit().on(&other).acquire().await.unwrap();
    let tokens = [
        first.fencing_token(),
        second.fencing_token(),
        third.fencing_token(),
    ];
    assert!(
        tokens
            .windows(2)
            .all(|pair| pair[0] < pair[1] || (slots && pair[0] <= pair[1])),
        "{tokens:?}"
    );
    let full = permit().on(&other).acquire().await.unwrap_err();
    assert!(full.is_busy(), "{full:?}");
    if !slots {
        assert_eq!(
            fx.backend().inspect(&key).await.unwrap().unwrap().shared,
            Some(3)
        );
    }
    let waiter = {
        let other = other.clone();
        let key = key.clone();
        tokio::spawn(async move {
            Lock::new(&key)
                .kind(LockKind::Permits(3))
                .on(&other)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .map(|guard| (guard.fencing_token(), guard))
        })
    };
    if !slots {
        until_waited_on(&fx, &key).await;
    }
    let freed = second.fencing_token();
    second.release().await.unwrap();
    let (token, fourth) = within(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
    assert!(token > freed, "the freed permit's next token is larger");
    if !slots {
        // An exclusive lock on a semaphore's key is a mistake, named.
        let mixed = Lock::new(&key)
            .on(fx.backend())
            .acquire()
            .await
            .unwrap_err();
        assert!(mixed.to_string().contains("semaphore"), "{mixed}");
    }
    for guard in [first, third, fourth] {
        guard.release().await.unwrap();
    }
    assert_eq!(fx.backend().inspect(&key).await.unwrap(), None);
    // (With a wait: on Redlock, callers racing for one slot can split its votes and retry.)
    let again = futures_util::future::join_all(
        (0..3).map(|_| permit().on(&other).wait(Duration::from_secs(5)).acquire()),
    )
    .await;
    assert!(
        again.iter().all(Result::is_ok),
        "every permit came back: {again:?}"
    );
}

/// Each shared holder has its own lease: the watchdog renews it, and one that is never released
/// (its process died) blocks nobody past its TTL.
pub(crate) async fn shared_holders_have_their_own_leases<F: Fixture>() {
    let fx = F::start(|b| b.watchdog_lease(Duration::from_millis(600)));
    let other = fx.contender();
    let key = unique_key("shared-lease");
    let renewed = read(&key).on(fx.backend()).acquire().await.unwrap();
    let dying = read(&key)
        .on(&other)
        .lease(Lease::Fixed(Duration::from_millis(300)))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(renewed.is_held(), "the watchdog renewed the reader's lease");
    // Gone by now on Redis; etcd ends leases in whole seconds, checked twice a second.
    let mut shared = None;
    let one_left = until(&fx, Duration::from_secs(2), async || {
        shared = fx.backend().inspect(&key).await.unwrap().unwrap().shared;
        shared == Some(1)
    })
    .await;
    assert!(
        one_left,
        "the fixed reader's lease never ran out: {shared:?}"
    );
    assert_eq!(dying.release().await.unwrap(), Released::Expired);
    renewed.release().await.unwrap();

    // A permit never given back returns when its lease ends.
    let sem = unique_key("dead-permit");
    let _dead = Lock::new(&sem)
        .kind(LockKind::Permits(1))
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_millis(300)))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let next = Lock::new(&sem)
        .kind(LockKind::Permits(1))
        .on(&other)
        .wait(Duration::from_secs(5))
        .acquire()
        .await
        .unwrap();
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "the dead permit came back with its TTL, not later: {waited:?}"
    );
    next.release().await.unwrap();
}

/// Reentrancy in one task: a read inside a read or a write proceeds without asking the server;
/// a write inside a read is refused (upgrading would deadlock two readers).
pub(crate) async fn nested_kinds_reenter_or_refuse_upgrades<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("nested");
    let backend = fx.backend().clone();
    let outcome = Lock::new(&key)
        .on(&backend)
        .run(async {
            let token = distlock::fencing_token();
            read(&key)
                .on(&backend)
                .run(async { distlock::fencing_token() })
                .await
                .map(|inner| (token, inner))
        })
        .await
        .unwrap();
    let (outer, inner) = outcome.unwrap();
    assert_eq!(outer, inner, "the read inside the write reentered");

    let upgrade = read(&key)
        .on(&backend)
        .run(async { Lock::new(&key).on(&backend).run(async {}).await })
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(upgrade, LockError::NestedKind { .. }),
        "{upgrade:?}"
    );
    assert!(upgrade.to_string().contains("upgrading"), "{upgrade}");
    let reads = read(&key)
        .on(&backend)
        .run(async { read(&key).on(&backend).run(async { 7 }).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reads, 7);
}

/// With a `max_backoff` longer than the writer's intent, the waiting writer still retries in
/// time to renew it: new readers stay queued behind it for as long as it waits.
pub(crate) async fn a_slow_backoff_does_not_let_readers_past_a_waiting_writer<F: Fixture>() {
    let fx = F::start(|b| b.max_backoff(Duration::from_secs(3)));
    let other = fx.contender();
    let key = unique_key("slow-backoff");
    let reader = read(&key).on(fx.backend()).acquire().await.unwrap();
    let writer = {
        let other = other.clone();
        let key = key.clone();
        tokio::spawn(async move {
            Lock::new(&key)
                .on(&other)
                .wait(Duration::from_secs(10))
                .acquire()
                .await
                .unwrap()
        })
    };
    until_waited_on(&fx, &key).await;
    // No event marks an intent lapsing: waiting past its 500 ms is the point.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let late = read(&key).on(&other).acquire().await.unwrap_err();
        assert!(
            late.is_busy(),
            "a reader got past the waiting writer: {late:?}"
        );
    }
    reader.release().await.unwrap();
    let writer = within(Duration::from_secs(5), writer).await.unwrap();
    writer.release().await.unwrap();
}
