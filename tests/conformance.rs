//! One conformance suite, run against every backend: the in-process backend, one real Redis,
//! Redlock over three real masters, a Sentinel group (a primary, a replica acknowledging every
//! grant and renewal, three sentinels), a Redis Cluster of three masters and three replicas, one
//! Valkey 8.1 server, a 3-member etcd cluster, a PostgreSQL server and a MariaDB server (the
//! MySQL engine), and the TLS-only Sentinel, Cluster and etcd deployments — all started by the
//! harness for each test — must behave alike.

mod common;
#[path = "conformance/kinds.rs"]
mod kinds;

use kinds::*;

use common::{
    until_waited_on, Cluster, ClusterTls, Etcd, EtcdTls, Fixture, InProcess, Mysql, Postgres,
    Redlock, Sentinel, SentinelTls, SingleRedis, UnfencedRedis, Valkey, Zookeeper,
};
use distlock::__private::raw;
use distlock::{Lease, Lock, LockError, LockKind, LostReason, OnLost, Released};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod in_process {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::InProcess>().await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::SingleRedis>().await;
                }
            )*
        }
        mod redis_unfenced {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::UnfencedRedis>().await;
                }
            )*
        }
        mod redlock {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Redlock>().await;
                }
            )*
        }
        mod valkey {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Valkey>().await;
                }
            )*
        }
        mod cluster {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Cluster>().await;
                }
            )*
        }
        mod sentinel {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Sentinel>().await;
                }
            )*
        }
        mod etcd {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Etcd>().await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Postgres>().await;
                }
            )*
        }
        mod mysql {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Mysql>().await;
                }
            )*
        }
        mod zookeeper {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::Zookeeper>().await;
                }
            )*
        }
        mod cluster_tls {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::ClusterTls>().await;
                }
            )*
        }
        mod sentinel_tls {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::SentinelTls>().await;
                }
            )*
        }
        mod etcd_tls {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $test() {
                    super::$test::<super::EtcdTls>().await;
                }
            )*
        }
    };
}

conformance!(
    acquire_then_release_frees_the_key,
    a_held_key_is_busy_for_others,
    a_fixed_lease_expires_and_is_reported_lost,
    foreign_tokens_can_neither_release_nor_renew,
    acquire_is_idempotent_for_the_same_owner,
    fencing_tokens_increase_over_10k_grants_and_counter_loss,
    watchdog_keeps_a_long_call_locked,
    a_renewal_that_finds_the_key_gone_or_taken_over_loses_the_lease,
    renewal_stops_when_the_call_returns_panics_or_is_cancelled,
    a_stalled_holder_learns_at_its_checkpoint_that_the_lease_is_gone,
    renewals_are_batched,
    multi_key_locks_are_all_or_none,
    nested_calls_on_a_held_key_reenter,
    abort_drops_the_body_when_the_lease_is_lost,
    max_hold_stops_renewal,
    over_long_keys_are_rejected,
    the_holder_label_is_stored_with_the_lock,
    list_finds_the_held_locks_matching_a_pattern,
    force_unlock_removes_any_holder_and_fences_it_out,
    readers_share_and_writers_exclude,
    a_waiting_writer_holds_new_readers_back,
    reader_tokens_sit_between_writers,
    a_semaphore_admits_exactly_its_permits,
    shared_holders_have_their_own_leases,
    nested_kinds_reenter_or_refuse_upgrades,
    a_slow_backoff_does_not_let_readers_past_a_waiting_writer,
    ping_checks_the_backend_without_touching_locks,
    extend_lengthens_a_fixed_lease_on_the_server_and_locally,
    shutdown_frees_every_lock_and_refuses_new_ones,
);

/// `ping` takes and releases its probe on the deployment (a quorum of Redlock's masters, the
/// primary Sentinel names, the cluster node owning the probe's slot), and as often as it is
/// called leaves nothing held, no lock of the application touched, nothing in the stats.
async fn ping_checks_the_backend_without_touching_locks<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("ping");
    let guard = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let before = fx.backend().stats();
    for _ in 0..3 {
        within(Duration::from_secs(10), fx.backend().ping())
            .await
            .unwrap();
    }
    // Concurrent pings take turns on the backend's one probe.
    let pings = (0..4).map(|_| fx.backend().ping());
    for ping in futures_util::future::join_all(pings).await {
        ping.unwrap();
    }
    let after = fx.backend().stats();
    assert_eq!(
        (after.acquired, after.released, after.busy),
        (before.acquired, before.released, before.busy),
        "{after:?}"
    );
    assert_eq!(
        holder_token(fx.backend(), &key).await,
        Some(guard.fencing_token())
    );
    let held = fx.backend().list("*").await.unwrap();
    assert_eq!(
        held.len(),
        1,
        "only the application's lock is held: {held:?}"
    );
    guard.release().await.unwrap();
}

/// The fencing token of `key`'s holder, as `inspect` reports it; `None` when it is free.
async fn holder_token(backend: &distlock::Backend, key: &str) -> Option<u64> {
    let holder = backend.inspect(key).await.unwrap();
    holder.map(|holder| holder.fencing_token)
}

/// `future`'s output, or a panic naming the deadline: a broken implementation fails the test
/// instead of hanging CI.
async fn within<T>(limit: Duration, future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("no outcome within {limit:?}"))
}

fn unique_key(test: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("{test}:{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

async fn acquire_then_release_frees_the_key<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("cycle");
    let guard = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let holder = fx.backend().inspect(&key).await.unwrap().expect("held");
    assert_eq!(holder.fencing_token, guard.fencing_token());
    assert!(holder.ttl <= fx.held_for(fx.backend().watchdog_lease()));
    assert_eq!(guard.release().await.unwrap(), Released::Released);
    assert_eq!(fx.backend().inspect(&key).await.unwrap(), None);
    assert_eq!(fx.pttl(&key).await, None);
    let stats = fx.backend().stats();
    assert_eq!((stats.acquired, stats.released), (1, 1));
}

/// A second client (another process, in effect) finds the key busy — refused by the server, not
/// by this process's local queue: its acquire script ran and answered "busy".
async fn a_held_key_is_busy_for_others<F: Fixture>() {
    let fx = F::start(|b| b);
    let other = fx.contender();
    let key = unique_key("busy");
    let _held = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let err = Lock::new(&key).on(&other).acquire().await.unwrap_err();
    let LockError::Busy { key: busy_key, .. } = &err else {
        panic!("expected Busy, got {err:?}")
    };
    assert_eq!(busy_key, &key);
    assert!(
        err.to_string()
            .contains("is held by someone else (a single try; the holder's lease ends in "),
        "{err}"
    );
    assert!(
        err.to_string()
            .ends_with("retry after that or allow a `wait`"),
        "{err}"
    );
    assert_holder_ttl(&err, &fx);
    assert_eq!(
        other.stats().busy_replies,
        1,
        "the server refused the contender's acquire"
    );

    let started = Instant::now();
    let err = Lock::new(&key)
        .on(&other)
        .wait(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap_err();
    let waited = started.elapsed();
    assert!(err.is_busy(), "{err:?}");
    assert!(
        waited >= Duration::from_millis(200),
        "gave up early: {waited:?}"
    );
    assert!(err.to_string().contains("(waited "), "{err}");
    assert_holder_ttl(&err, &fx);
    let stats = other.stats();
    assert_eq!(stats.busy, 2);
    assert!(
        stats.busy_replies >= 3,
        "the waiting contender asked the server again (subscribe-before-check): {stats:?}"
    );
    // The holder's own process answers a second local caller from its queue, without asking
    // the server.
    let err = Lock::new(&key)
        .on(fx.backend())
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_busy(), "{err:?}");
    assert_eq!(fx.backend().stats().busy_replies, 0);
    assert_eq!(err.retry_after(), None, "no server was asked: {err:?}");
    assert!(
        err.to_string().ends_with("retry later or allow a `wait`"),
        "{err}"
    );
}

/// A busy call's `retry_after` is the holder's remaining lease as the server reported it: at
/// most the lease's TTL, and more than half of it (the watchdog renews every third).
fn assert_holder_ttl<F: Fixture>(err: &LockError, fx: &F) {
    let left = err
        .retry_after()
        .unwrap_or_else(|| panic!("a busy reply from the server says when: {err:?}"));
    let lease = fx.backend().watchdog_lease();
    assert!(
        left > lease / 2 && left <= fx.held_for(lease),
        "retry_after {left:?} for a {lease:?} watchdog lease"
    );
}

async fn a_fixed_lease_expires_and_is_reported_lost<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("expiry");
    let guard = Lock::new(&key)
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .acquire()
        .await
        .unwrap();
    let lost = within(Duration::from_secs(5), guard.lost()).await;
    assert_eq!(lost.lost_reason(), Some(LostReason::Expired), "{lost:?}");
    assert!(!guard.is_held());
    // Our local validity ends before the server's TTL (drift margin): wait for the server.
    let next = Lock::new(&key)
        .on(fx.backend())
        .wait(Duration::from_secs(2))
        .acquire()
        .await
        .expect("free once the lease expired on the server");
    assert_later_token(&fx, next.fencing_token(), guard.fencing_token());
    assert_eq!(guard.release().await.unwrap(), Released::TakenOver);
    assert_eq!(fx.backend().stats().release_taken_over, 1);
}

/// `extend` adds to a fixed lease on the server (the key's TTL is what was left plus the
/// extension) and locally (the lease outlives its first end); a lease lost or taken over is not
/// extended back, and a watchdog lease has nothing to extend.
async fn extend_lengthens_a_fixed_lease_on_the_server_and_locally<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("extend");
    let first = Duration::from_millis(400);
    let guard = Lock::new(&key)
        .on(fx.backend())
        .lease(Lease::Fixed(first))
        .acquire()
        .await
        .unwrap();
    let granted = Instant::now();
    guard.extend(Duration::from_secs(20)).await.unwrap();
    let on_server = fx.pttl(&key).await.expect("held");
    assert!(
        on_server > Duration::from_secs(19) && on_server <= Duration::from_secs(21),
        "the key's TTL is {on_server:?} after extending a {first:?} lease by 20s"
    );
    // Cancelled after its first poll (the request may be on its way, or done where the engine
    // answers at once): the lease stays held, whatever the server did.
    let cancelled = futures_util::FutureExt::now_or_never(guard.extend(Duration::from_secs(1)));
    assert!(
        cancelled.as_ref().is_none_or(Result::is_ok),
        "{cancelled:?}"
    );
    assert!(guard.is_held());
    // Past the first end, the lease holds, and the lock is still ours.
    tokio::time::sleep((granted + first * 2).saturating_duration_since(Instant::now())).await;
    assert!(guard.is_held());
    assert_eq!(
        holder_token(fx.backend(), &key).await,
        Some(guard.fencing_token())
    );
    // Taken over: the extension finds it and the lease is lost, not lengthened.
    let holder = fx.backend().inspect(&key).await.unwrap().expect("held");
    assert_eq!(
        raw::release(fx.backend(), &key, &holder.owner)
            .await
            .unwrap(),
        1
    );
    raw::acquire(
        fx.backend(),
        &key,
        &raw::new_owner(),
        Duration::from_secs(30),
    )
    .await
    .unwrap()
    .expect("free after the delete");
    let err = guard.extend(Duration::from_secs(20)).await.unwrap_err();
    assert_eq!(err.lost_reason(), Some(LostReason::TakenOver), "{err:?}");
    assert!(!guard.is_held());

    let watched = Lock::new(unique_key("extend-watchdog"))
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let err = watched.extend(Duration::from_secs(1)).await.unwrap_err();
    assert!(err.to_string().contains("renewed by the watchdog"), "{err}");
    watched.release().await.unwrap();
}

/// `shutdown` releases every lease of the backend on the deployment (exclusive, read, permit),
/// tells their holders, and refuses new locks; another client takes the keys at once.
async fn shutdown_frees_every_lock_and_refuses_new_ones<F: Fixture>() {
    let fx = F::start(|b| b);
    let other = fx.contender();
    let keys = [unique_key("down"), unique_key("down"), unique_key("down")];
    let mut guards = Vec::new();
    for (key, kind) in keys
        .iter()
        .zip([LockKind::Exclusive, LockKind::Read, LockKind::Permits(2)])
    {
        let guard = Lock::new(key)
            .on(fx.backend())
            .kind(kind)
            .acquire()
            .await
            .unwrap();
        guards.push(guard);
    }
    within(Duration::from_secs(10), fx.backend().shutdown())
        .await
        .unwrap();
    for guard in &guards {
        assert_eq!(
            guard.check().unwrap_err().lost_reason(),
            Some(LostReason::ShutDown)
        );
    }
    for key in &keys {
        let taken = Lock::new(key).on(&other).acquire().await;
        assert!(
            taken.is_ok(),
            "`{key}` still held after shutdown: {taken:?}"
        );
    }
    let refused = Lock::new(unique_key("down"))
        .on(fx.backend())
        .acquire()
        .await;
    assert!(
        matches!(refused, Err(LockError::ShutDown { .. })),
        "{refused:?}"
    );
    for guard in guards {
        assert_eq!(guard.release().await.unwrap(), Released::Released);
    }
}

async fn foreign_tokens_can_neither_release_nor_renew<F: Fixture>() {
    let fx = F::start(|b| b);
    let backend = fx.backend();
    let key = unique_key("ownership");
    // Outlives the thousand impostors' three round trips each: on a loaded machine an etcd
    // cluster's took more than 30 s, and the lock lapsed under them.
    let ttl = Duration::from_secs(600);
    let previous = raw::new_owner();
    raw::acquire(backend, &key, &previous, ttl)
        .await
        .unwrap()
        .expect("free");
    assert_eq!(raw::release(backend, &key, &previous).await.unwrap(), 1);
    let owner = raw::new_owner();
    raw::acquire(backend, &key, &owner, ttl)
        .await
        .unwrap()
        .expect("free");
    // Impostors ask for a far longer TTL: a renewal that said "not ours" but still extended
    // the key would show on the server.
    let long = Duration::from_secs(3_600);

    let mut impostors = vec![
        String::new(),
        previous,
        owner[..39].to_owned(),
        owner[..1].to_owned(),
        format!("{owner}0"),
        owner.to_uppercase(),
    ];
    while impostors.len() < 1_000 {
        impostors.push(raw::new_owner());
    }
    let mut accepted = 0;
    for impostor in &impostors {
        accepted += (raw::release(backend, &key, impostor).await.unwrap() == 1) as usize;
        accepted += (raw::renew(backend, &key, impostor, long).await.unwrap() == 1) as usize;
        assert_eq!(
            raw::acquire(backend, &key, impostor, ttl).await.unwrap(),
            None
        );
    }
    assert_eq!(accepted, 0, "foreign tokens released or renewed the lock");
    let left = fx.pttl(&key).await.expect("still held by its owner");
    assert!(
        left <= ttl,
        "a foreign renewal extended the lock to {left:?} on the server"
    );
    let holder = backend.inspect(&key).await.unwrap().expect("held");
    assert_eq!(holder.owner, owner, "still the owner's");
    // A renewal of a key that is gone does not bring it back.
    let gone = unique_key("gone");
    assert_eq!(raw::renew(backend, &gone, &owner, long).await.unwrap(), 0);
    assert_eq!(fx.pttl(&gone).await, None, "a renewal created a lock");
    assert_eq!(
        raw::release(backend, &key, &owner).await.unwrap(),
        1,
        "the owner still can"
    );
}

async fn acquire_is_idempotent_for_the_same_owner<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("idempotent");
    let owner = raw::new_owner();
    let first = raw::acquire(fx.backend(), &key, &owner, Duration::from_secs(5))
        .await
        .unwrap();
    let again = raw::acquire(fx.backend(), &key, &owner, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(first.is_some());
    assert_eq!(
        first, again,
        "a retry with the same owner is the same grant"
    );
    let ttl = fx.pttl(&key).await.expect("held");
    assert!(
        ttl > Duration::from_secs(5),
        "the retry refreshed the TTL: {ttl:?}"
    );
}

async fn fencing_tokens_increase_over_10k_grants_and_counter_loss<F: Fixture>() {
    let fx = F::start(|b| b);
    if !fx.fenced() {
        return efficiency_locks_carry_no_token_and_leave_no_marker(&fx).await;
    }
    let key = unique_key("fence");
    let mut last = 0u64;
    let mut decreases = 0;
    let grants = fx.grants_in_a_row();
    for grant in 0..grants {
        if grant % (grants / 4) == grants / 8 {
            fx.forget_token_marker(&key).await;
        }
        // Waiting, not a single try: on a loaded machine a Redlock master may miss its
        // 50 ms budget for a grant or a release, and the key is busy until the next try.
        let guard = Lock::new(&key)
            .on(fx.backend())
            .wait(Duration::from_secs(30))
            .acquire()
            .await
            .unwrap();
        let token = guard.fencing_token();
        decreases += (token <= last) as usize;
        last = token;
        guard.release().await.unwrap();
    }
    assert_eq!(decreases, 0, "fencing tokens must strictly increase");
    assert!(
        last > fx.least_token(),
        "tokens are past {}: {last}",
        fx.least_token()
    );
}

/// Efficiency locks (`fencing_tokens(false)`): every grant, by a first try or by a waiter, has
/// token 0, and a release deletes the key (no token marker to keep).
async fn efficiency_locks_carry_no_token_and_leave_no_marker<F: Fixture>(fx: &F) {
    let key = unique_key("unfenced");
    let contender = fx.contender();
    for round in 0..200 {
        let guard = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
        assert_eq!(guard.fencing_token(), 0, "round {round}");
        // Every tenth round someone waits: the lock is handed over, still without a token.
        if round % 10 == 0 {
            let waiter = Lock::new(&key).on(&contender).wait(Duration::from_secs(5));
            let waiting = tokio::spawn(async move { waiter.acquire().await });
            until_waited_on(fx, &key).await;
            guard.release().await.unwrap();
            let handed = waiting.await.unwrap().unwrap();
            assert_eq!(handed.fencing_token(), 0, "round {round}, handed over");
            handed.release().await.unwrap();
        } else {
            guard.release().await.unwrap();
        }
        assert_eq!(fx.pttl(&key).await, None, "round {round}: the key is gone");
    }
}

/// `later`, a token granted after `earlier` for the same key, is larger; an efficiency lock's is 0.
fn assert_later_token<F: Fixture>(fx: &F, later: u64, earlier: u64) {
    match fx.fenced() {
        true => assert!(later > earlier, "{later} after {earlier}"),
        false => assert_eq!(later, 0, "an efficiency lock has no token"),
    }
}

/// A 1 s lease: room for a renewal on a loaded machine, where a ZooKeeper renewal can take
/// longer than 200 ms.
async fn watchdog_keeps_a_long_call_locked<F: Fixture>() {
    let ttl = Duration::from_secs(1);
    let fx = F::start(|b| b.watchdog_lease(ttl));
    let prober = fx.contender();
    let key = unique_key("watchdog");
    let guard = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let until = Instant::now() + ttl * 3;
    let mut probes = 0;
    // Probes at a fixed pace are the point: the key must be busy at every one of them, for
    // three leases and at least 20 probes (on a loaded machine a probe may take longer than
    // the pace, so the probes, not the clock, decide when enough were made).
    let mut interval = tokio::time::interval(ttl / 10);
    while Instant::now() < until || probes < 20 {
        interval.tick().await;
        let probe = Lock::new(&key).on(&prober).acquire().await;
        assert!(
            matches!(probe, Err(LockError::Busy { .. })),
            "probe {probes} got {probe:?}"
        );
        assert!(guard.is_held());
        probes += 1;
    }
    assert_eq!(
        prober.stats().busy_replies,
        probes,
        "every probe was refused by the server"
    );
    let left = fx.pttl(&key).await.expect("held");
    assert!(
        left > ttl / 3,
        "renewed on the server, not only in the client: PTTL {left:?}"
    );
    assert!(
        fx.backend().stats().renewed >= 6,
        "{:?}",
        fx.backend().stats()
    );
    guard.release().await.unwrap();
}

async fn a_renewal_that_finds_the_key_gone_or_taken_over_loses_the_lease<F: Fixture>() {
    let ttl = Duration::from_millis(300);
    let fx = F::start(|b| b.watchdog_lease(ttl));
    let backend = fx.backend();
    for (key, reason) in [
        ("gone", LostReason::Gone),
        ("taken-over", LostReason::TakenOver),
    ] {
        let guard = Lock::new(key).on(backend).acquire().await.unwrap();
        // Someone with the owner token (an operator, a bug) deletes the lock on the server.
        let holder = backend.inspect(key).await.unwrap().expect("held");
        assert_eq!(raw::release(backend, key, &holder.owner).await.unwrap(), 1);
        if reason == LostReason::TakenOver {
            raw::acquire(backend, key, &raw::new_owner(), Duration::from_secs(30))
                .await
                .unwrap()
                .expect("free after the delete");
        }
        let started = Instant::now();
        let lost = within(Duration::from_secs(5), guard.lost()).await;
        assert_eq!(lost.lost_reason(), Some(reason), "{lost:?}");
        assert!(
            started.elapsed() < ttl,
            "found at the next renewal, before validity ran out"
        );
        assert!(guard.check().is_err());
    }
}

/// The lease's PTTL must only fall after the call ends (no renewal), and the key must be gone
/// within one TTL: looked at again each time the servers report a command (a renewal would be
/// one) or an expiry. The in-process store reports nothing, but where a key ends is known: it is
/// looked at once its PTTL has run out, and must be gone then.
async fn assert_not_renewed<F: Fixture>(fx: &F, key: &str, ttl: Duration) {
    if fx.servers().is_empty() && fx.etcd().is_none() {
        let Some(pttl) = fx.pttl(key).await else {
            return;
        };
        assert!(pttl <= ttl, "PTTL {pttl:?} above the lease's TTL {ttl:?}");
        // The in-process PTTL is exact to the millisecond; a margin for the rounding.
        tokio::time::sleep(pttl + Duration::from_millis(2)).await;
        let after = fx.pttl(key).await;
        assert!(
            after.is_none(),
            "{key} still held {after:?} after its PTTL ran out: still renewed"
        );
        return;
    }
    let mut previous = Duration::MAX;
    let gone = common::until(
        fx,
        fx.held_for(ttl) + Duration::from_millis(200),
        async || {
            let Some(pttl) = fx.pttl(key).await else {
                return true;
            };
            assert!(
                pttl <= previous,
                "PTTL rose from {previous:?} to {pttl:?}: still renewed"
            );
            previous = pttl;
            false
        },
    )
    .await;
    assert!(gone, "{key} still held after one TTL");
}

/// Spawns `body` under a lock on `key`; returns once the body has started.
async fn spawn_locked(
    backend: &distlock::Backend,
    key: &str,
    body: impl std::future::Future<Output = ()> + Send + 'static,
) -> tokio::task::JoinHandle<Result<(), LockError>> {
    let (entered_tx, entered_rx) = tokio::sync::oneshot::channel();
    let lock = Lock::new(key).on(backend);
    let task = tokio::spawn(lock.run(async move {
        entered_tx.send(()).unwrap();
        body.await
    }));
    entered_rx.await.expect("the body started");
    task
}

async fn renewal_stops_when_the_call_returns_panics_or_is_cancelled<F: Fixture>() {
    let ttl = Duration::from_millis(300);
    let fx = Arc::new(F::start(|b| b.watchdog_lease(ttl)));

    let key = unique_key("returns");
    Lock::new(&key)
        .on(fx.backend())
        .run(async {})
        .await
        .unwrap();
    assert_not_renewed(&*fx, &key, ttl).await;

    let key = unique_key("panics");
    let panicked = spawn_locked(fx.backend(), &key, async { panic!("the body panics") }).await;
    assert!(panicked.await.unwrap_err().is_panic());
    assert_not_renewed(&*fx, &key, ttl).await;

    let key = unique_key("cancelled");
    let cancelled = spawn_locked(fx.backend(), &key, std::future::pending::<()>()).await;
    cancelled.abort();
    assert!(cancelled.await.unwrap_err().is_cancelled());
    assert_not_renewed(&*fx, &key, ttl).await;
    assert_eq!(
        raw::watched_leases(fx.backend()),
        0,
        "no lease left in the watchdog"
    );
}

async fn a_stalled_holder_learns_at_its_checkpoint_that_the_lease_is_gone<F: Fixture>() {
    let ttl = Duration::from_millis(200);
    let fx = F::start(|b| b.watchdog_lease(ttl));
    let key = unique_key("stalled");
    let backend = fx.backend().clone();
    // A process that stops (SIGSTOP, a long GC pause) stops its watchdog too. A current-thread
    // runtime whose one thread blocks is that process in miniature: its watchdog task (spawned on
    // this runtime by the acquisition) cannot run while the body stalls.
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(Lock::new(&key).on(&backend).run(async {
            distlock::checkpoint()?;
            std::thread::sleep(ttl * 2);
            distlock::checkpoint()
        }))
    })
    .join()
    .unwrap()
    .unwrap();
    let err = outcome.expect_err("the stalled holder must see its lease lost");
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err:?}");
}

async fn renewals_are_batched<F: Fixture>() {
    // Long enough that a renewal period delayed by a loaded machine (CI runs this beside the
    // other lane; at 1.5 s a ZooKeeper lease was once lost there) loses no lease; the test
    // counts calls, not time.
    let ttl = Duration::from_secs(3);
    let fx = F::start(|b| b.watchdog_lease(ttl).renew_batch(100));
    let mut guards = Vec::new();
    for i in 0..1_000 {
        guards.push(
            Lock::new(format!("batch:{i}"))
                .on(fx.backend())
                .acquire()
                .await
                .unwrap(),
        );
    }
    // One period to bring the leases into phase, then count over two more.
    let period = ttl / 3;
    tokio::time::sleep(period).await;
    let before = fx.backend().stats();
    tokio::time::sleep(period * 2).await;
    let after = fx.backend().stats();
    let calls = after.renewal_calls - before.renewal_calls;
    let renewed = after.renewed - before.renewed;
    assert!(
        renewed >= 1_000,
        "every lease renewed at least once: {renewed}"
    );
    // ceil(1000 / 100) calls a period, plus one period boundary falling inside the window.
    assert!(
        calls <= 3 * 10,
        "{calls} renewal calls for {renewed} renewals in two periods: not batched"
    );
    assert!(guards.iter().all(|guard| guard.is_held()));
}

async fn multi_key_locks_are_all_or_none<F: Fixture>() {
    let fx = F::start(|b| b);
    let (a, b, c) = (
        unique_key("multi-a"),
        unique_key("multi-b"),
        unique_key("multi-c"),
    );
    let held_b = Lock::new(&b).on(fx.backend()).acquire().await.unwrap();
    let err = Lock::keys([&a, &b, &c])
        .on(fx.backend())
        .acquire()
        .await
        .unwrap_err();
    assert!(err.is_busy());
    assert_eq!(
        fx.backend().inspect(&a).await.unwrap(),
        None,
        "none: a was given back"
    );
    assert_eq!(
        fx.backend().inspect(&c).await.unwrap(),
        None,
        "none: c never taken"
    );
    held_b.release().await.unwrap();
    let all = Lock::keys([&c, &a, &b])
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let keys: Vec<&str> = all.keys().collect();
    let mut sorted = vec![a.as_str(), b.as_str(), c.as_str()];
    sorted.sort();
    assert_eq!(keys, sorted, "canonical order");
    all.release().await.unwrap();

    // Opposite orders at once cannot deadlock.
    let backend = fx.backend().clone();
    let mut tasks = Vec::new();
    for i in 0..8 {
        let keys = if i % 2 == 0 {
            [a.clone(), b.clone()]
        } else {
            [b.clone(), a.clone()]
        };
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                Lock::keys(keys.clone())
                    .on(&backend)
                    .wait(Duration::from_secs(10))
                    .run(tokio::task::yield_now())
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

async fn nested_calls_on_a_held_key_reenter<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("reentrant");
    let backend = fx.backend();
    let (outer, inner) = Lock::new(&key)
        .on(backend)
        .run(async {
            let outer = distlock::fencing_token();
            let inner = Lock::new(&key)
                .on(backend)
                .run(async { distlock::fencing_token() })
                .await
                .unwrap();
            assert!(
                distlock::is_held(),
                "the inner call did not release the outer lock"
            );
            (outer, inner)
        })
        .await
        .unwrap();
    assert_eq!(outer, inner, "no second acquisition");
    assert_eq!(backend.stats().acquired, 1);
    assert_eq!(
        backend.inspect(&key).await.unwrap(),
        None,
        "the outer call released"
    );
}

async fn abort_drops_the_body_when_the_lease_is_lost<F: Fixture>() {
    let fx = F::start(|b| b);
    let key = unique_key("abort");
    let (reached_end_tx, reached_end_rx) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let run = Lock::new(&key)
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_millis(150)))
        .on_lost(OnLost::Abort)
        .run(async {
            // Would finish at 600 ms, long after the 150 ms lease.
            tokio::time::sleep(Duration::from_millis(600)).await;
            let _ = reached_end_tx.send(());
        });
    let err = within(Duration::from_secs(5), run)
        .await
        .expect_err("an aborted body is an error");
    let took = started.elapsed();
    assert_eq!(err.lost_reason(), Some(LostReason::Expired), "{err:?}");
    assert!(
        took < Duration::from_millis(600),
        "returned when the lease was lost, not when the body ended: {took:?}"
    );
    // The body was dropped: its sender is gone without having sent.
    assert!(reached_end_rx.await.is_err(), "the body ran to its end");
}

/// A 1 s lease renewed until a `max_hold` of 1.5 s. The lease leaves a renewal room on a loaded
/// machine, where a ZooKeeper renewal can take longer than 200 ms.
async fn max_hold_stops_renewal<F: Fixture>() {
    let ttl = Duration::from_secs(1);
    let fx = F::start(|b| b.watchdog_lease(ttl));
    let key = unique_key("max-hold");
    let guard = Lock::new(&key)
        .on(fx.backend())
        .max_hold(Duration::from_millis(1_500))
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let lost = within(Duration::from_secs(5), guard.lost()).await;
    assert_eq!(
        lost.lost_reason(),
        Some(LostReason::MaxHoldExceeded),
        "{lost:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_millis(1_500),
        "renewed until max_hold"
    );
}

async fn over_long_keys_are_rejected<F: Fixture>() {
    let fx = F::start(|b| b.max_key_len(64));
    let err = Lock::new("k".repeat(65))
        .on(fx.backend())
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("65 bytes long, over the backend's limit of 64"),
        "{err}"
    );
    Lock::new("k".repeat(64))
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let err = Lock::new("a{b}")
        .on(fx.backend())
        .acquire()
        .await
        .unwrap_err();
    assert!(matches!(err, LockError::InvalidKey { .. }), "{err:?}");
}

/// "Who holds it" has an answer: the backend's label (never the owner token) is written with
/// every lock, shown by inspect and kept through renewals; an empty label writes none.
async fn the_holder_label_is_stored_with_the_lock<F: Fixture>() {
    let fx = F::start(|b| b.holder_label("billing-worker 3 (blue)"));
    let key = unique_key("label");
    let guard = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let holder = fx.backend().inspect(&key).await.unwrap().expect("held");
    assert_eq!(holder.label.as_deref(), Some("billing-worker 3 (blue)"));
    assert!(!holder.waited_on, "{holder:?}");
    assert_eq!(holder.fencing_token, guard.fencing_token());
    // The label follows the owner token in the value: renewal and release still match the owner.
    let renewed = Lock::new(&key).on(fx.backend()).acquire().await;
    assert!(renewed.unwrap_err().is_busy());
    assert_eq!(guard.release().await.unwrap(), Released::Released);

    let unlabelled = F::start(|b| b.holder_label(""));
    let _held = Lock::new(&key)
        .on(unlabelled.backend())
        .acquire()
        .await
        .unwrap();
    let holder = unlabelled
        .backend()
        .inspect(&key)
        .await
        .unwrap()
        .expect("held");
    assert_eq!(holder.label, None);
}

async fn list_finds_the_held_locks_matching_a_pattern<F: Fixture>() {
    let fx = F::start(|b| b);
    let scope = unique_key("list");
    let short = Lock::new(format!("{scope}:a"))
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_secs(20)))
        .acquire()
        .await
        .unwrap();
    let long = Lock::new(format!("{scope}:b"))
        .on(fx.backend())
        .lease(Lease::Fixed(Duration::from_secs(40)))
        .acquire()
        .await
        .unwrap();
    let _elsewhere = Lock::new(format!("other-{scope}"))
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    // A released lock leaves a token marker, which is not a held lock.
    let released = Lock::new(format!("{scope}:c"))
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    released.release().await.unwrap();

    let held = fx.backend().list(&format!("{scope}:*")).await.unwrap();
    let keys: Vec<&str> = held.iter().map(|lock| lock.key.as_str()).collect();
    assert_eq!(
        keys,
        [format!("{scope}:a"), format!("{scope}:b")],
        "soonest to expire first"
    );
    assert_eq!(held[0].holder.fencing_token, short.fencing_token());
    assert_eq!(held[1].holder.fencing_token, long.fencing_token());
    short.release().await.unwrap();
    let held = fx.backend().list(&format!("{scope}:?")).await.unwrap();
    assert_eq!(held.len(), 1);
    assert_eq!(held[0].key, format!("{scope}:b"));
}

/// An operator breaks a stuck lock: it is free at once, the next token is larger than the
/// removed holder's, and the removed holder learns at its next renewal that its lease is gone.
async fn force_unlock_removes_any_holder_and_fences_it_out<F: Fixture>() {
    let fx = F::start(|b| b.watchdog_lease(Duration::from_millis(600)));
    let other = fx.contender();
    let key = unique_key("unlock");
    let stuck = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
    let removed = other
        .force_unlock(&key)
        .await
        .unwrap()
        .expect("it was held");
    assert_eq!(removed.fencing_token, stuck.fencing_token());
    assert_eq!(fx.backend().inspect(&key).await.unwrap(), None);
    assert_eq!(other.force_unlock(&key).await.unwrap(), None, "free now");

    let next = Lock::new(&key).on(&other).acquire().await.unwrap();
    assert_later_token(&fx, next.fencing_token(), stuck.fencing_token());
    let lost = within(Duration::from_secs(3), stuck.lost()).await;
    assert!(
        matches!(
            lost,
            LockError::Lost {
                reason: LostReason::TakenOver | LostReason::Gone,
                ..
            }
        ),
        "the removed holder is told: {lost:?}"
    );
    assert!(!stuck.is_held());
    assert_eq!(stuck.release().await.unwrap(), Released::TakenOver);
    next.release().await.unwrap();
}

/// Taking one lock after another wakes the watchdog only for a lease it must look at before it
/// would anyway: leases of seconds, registered while it idles, cost it no wake-up. (One per lock
/// cost a task switch per lock, and a worker thread woken to run the watchdog while the lock's
/// release was being sent: two thirds more client CPU per uncontended cycle.) That a lease due
/// sooner does wake it, every test of short leases shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_taken_one_after_another_do_not_wake_the_watchdog() {
    let fx = SingleRedis::start(|b| b.watchdog_lease(Duration::from_secs(30)));
    let backend = fx.backend();
    // A short lease starts the watchdog task, which idles once it is gone.
    Lock::new("first")
        .on(backend)
        .lease(Lease::Fixed(Duration::from_millis(100)))
        .run(async {})
        .await
        .unwrap();
    let idle = raw::until_local(Duration::from_secs(5), async || raw::watchdog_idle(backend)).await;
    assert!(idle, "the watchdog never idled");
    let before = raw::watchdog_woken(backend);
    for i in 0..200 {
        Lock::new(format!("k{i}"))
            .on(backend)
            .run(async {})
            .await
            .unwrap();
    }
    let woken = raw::watchdog_woken(backend) - before;
    assert_eq!(woken, 0, "200 locks woke the watchdog {woken} times");
}
