//! Redis Cluster, on a real cluster started per test (three masters, three replicas, created with
//! `redis-cli --cluster create`): renewal grouped per master, release notifications over sharded
//! pub/sub. Figures are printed as `CLUSTER …` lines on stderr.

mod common;

use common::{
    command_calls, until_shard_subscribers, Cluster, ClusterOf, Fixture, SingleRedis, PREFIX,
};
use distlock::__private::raw;
use distlock::{Lock, LockError};
use distlock_test_support::{RedisCluster, RedisServer, Reply};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

const LEASES: usize = 500;

/// 500 watchdog leases over 50 slots, held for three TTLs: none lost, each renewal round sends
/// one pipeline per master (round trips per period = masters holding leases), one script call
/// per slot, and a contender's probe finds every one of them busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_is_one_round_trip_per_master_per_period() {
    let ttl = Duration::from_millis(900);
    let fx = Cluster::start(|b| b.watchdog_lease(ttl).renew_batch(LEASES));
    // Ten leases per slot: keys picked so that their lock keys' slots collide.
    let keys = keys_sharing_slots(LEASES / 10, 10);
    let slots: BTreeSet<u16> = keys
        .iter()
        .map(|key| RedisCluster::slot_of(SingleRedis::lock_key(key)))
        .collect();
    let mut guards = Vec::new();
    for key in &keys {
        guards.push(Lock::new(key).on(fx.backend()).acquire().await.unwrap());
    }
    let masters = fx.cluster.masters().len() as u64;
    let evalsha = || -> u64 {
        fx.cluster
            .masters()
            .iter()
            .map(|master| command_calls(master, "evalsha"))
            .sum()
    };
    // One period first: the leases come into phase and the renewal script is loaded on every
    // master (a node without it costs one more round trip, once).
    tokio::time::sleep(ttl / 3).await;
    let (calls_before, trips_before, scripts_before) = (
        fx.backend().stats().renewal_calls,
        raw::renewal_round_trips(fx.backend()),
        evalsha(),
    );
    // Three TTLs: nine renewal periods.
    tokio::time::sleep(ttl * 3).await;
    let (calls, trips, scripts) = (
        fx.backend().stats().renewal_calls - calls_before,
        raw::renewal_round_trips(fx.backend()) - trips_before,
        evalsha() - scripts_before,
    );
    let held = guards.iter().filter(|guard| guard.is_held()).count();
    let contender = fx.contender();
    let mut busy = 0;
    for key in &keys {
        match Lock::new(key).on(&contender).acquire().await {
            Err(LockError::Busy { .. }) => busy += 1,
            Ok(_) => panic!("{key} was free while its lease was held"),
            Err(err) => panic!("{key}: {err}"),
        }
    }
    eprintln!(
        "CLUSTER {LEASES} leases in {} slots on {masters} masters, held {:?}: {calls} renewal \
         rounds, {trips} round trips ({:.2} per round), {scripts} script calls ({:.1} per round); \
         {held} held, {busy} busy to a contender",
        slots.len(),
        ttl * 3,
        trips as f64 / calls as f64,
        scripts as f64 / calls as f64,
    );
    assert!(
        calls >= 6,
        "the watchdog renewed every period: {calls} rounds"
    );
    assert_eq!(held, LEASES, "a lease was lost");
    assert_eq!(busy, LEASES);
    // A round in flight at either end of the window may count on one side only.
    let about = |count: u64, per_round: u64| {
        (calls.saturating_sub(1) * per_round..=(calls + 1) * per_round).contains(&count)
    };
    assert!(
        about(trips, masters),
        "one round trip per master holding leases per renewal round: {trips} for {calls} rounds"
    );
    assert!(
        about(scripts, slots.len() as u64),
        "one script call per slot per round: {scripts} for {calls} rounds"
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
}

/// Waiters are woken by sharded notifications (`SPUBLISH` on the slot's node, `SSUBSCRIBE`
/// there): a handoff takes a few milliseconds, not a backoff (30 s here), no classic `PUBLISH`
/// is sent, and `PUBSUB SHARDNUMSUB` is back to 0 once the waiters are gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_by_sharded_notifications() {
    let fx = Cluster::start(|b| b);
    let waiters = fx.contender();
    raw::set_backoff_floor(&waiters, Duration::from_secs(30));
    let mut handoffs = Vec::new();
    for round in 0..20 {
        let key = format!("handoff:{round}");
        let owner = fx.owner_of(&key);
        let holder = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
        let waiter = common::spawn_waiter(&waiters, &key, Duration::from_secs(60));
        until_shard_subscribers(owner, &key, 1).await;
        let released = Instant::now();
        holder.release().await.unwrap();
        let acquired = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not woken by the release")
            .unwrap()
            .unwrap();
        handoffs.push(acquired - released);
        until_shard_subscribers(owner, &key, 0).await;
    }
    handoffs.sort_unstable();
    let publishes: u64 = fx
        .cluster
        .masters()
        .iter()
        .map(|master| command_calls(master, "publish"))
        .sum();
    let spublishes: u64 = fx
        .cluster
        .masters()
        .iter()
        .map(|master| command_calls(master, "spublish"))
        .sum();
    eprintln!(
        "CLUSTER sharded notifications: handoff p50 {:?}, max {:?} over {} rounds; {spublishes} \
         SPUBLISH, {publishes} PUBLISH",
        handoffs[handoffs.len() / 2],
        handoffs[handoffs.len() - 1],
        handoffs.len()
    );
    assert!(handoffs[handoffs.len() / 2] < Duration::from_millis(100));
    // The doctor reads a cluster too (the harness's nodes run without persistence).
    let findings = fx.backend().doctor().await.unwrap();
    assert!(
        findings
            .iter()
            .any(|finding| finding.check == distlock::Check::Persistence),
        "{findings:?}"
    );
    assert_eq!(publishes, 0, "a classic PUBLISH is broadcast to every node");
    assert!(spublishes >= 20, "every waited-on release was announced");
}

/// Efficiency locks on a cluster: each first try is one `SET NX PX` routed to the key's
/// master, a waiter is handed the lock with token 0, and a release deletes the key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn efficiency_locks_claim_their_keys_on_each_master() {
    let fx = Cluster::start(|b| b.fencing_tokens(false));
    let waiters = fx.contender();
    let evalsha = |fx: &Cluster| -> u64 {
        let masters = fx.cluster.masters();
        masters.iter().map(|m| command_calls(m, "evalsha")).sum()
    };
    for round in 0..6 {
        let key = format!("claim:{round}");
        let scripts = evalsha(&fx);
        let holder = Lock::new(&key).on(fx.backend()).acquire().await.unwrap();
        assert_eq!(
            evalsha(&fx),
            scripts,
            "{key}: claimed with SET NX, no script"
        );
        assert_eq!(holder.fencing_token(), 0);
        let waiter = Lock::new(&key).on(&waiters).wait(Duration::from_secs(10));
        let waiting = tokio::spawn(async move { waiter.acquire().await });
        common::until_waited_on(&fx, &key).await;
        holder.release().await.unwrap();
        let handed = waiting.await.unwrap().unwrap();
        assert_eq!(
            handed.fencing_token(),
            0,
            "{key}: handed over without a token"
        );
        handed.release().await.unwrap();
        let lock = SingleRedis::lock_key(&key);
        let left = fx.owner_of(&key).command(&["EXISTS", &lock]);
        assert_eq!(left, Reply::Int(0), "{key}: released by deleting");
    }
}

/// A master killed while leases are held on every shard and tasks loop fenced sections on
/// keys of every shard: its replica is promoted; the leases on other shards see no error and
/// stay held; each lease on the failed shard is kept or reported lost — and a contender gets
/// one only after its holder learned it lost it; new acquisitions work after the promotion; 0
/// overlaps and 0 rejected fenced writes throughout.
///
/// The nodes run with `cluster-require-full-coverage no`, which is what confines a failure to
/// its shard: with Redis's default (`yes`, the next test) every node answers `CLUSTERDOWN` from
/// the moment the master is marked failed until its replica is promoted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_costs_only_its_own_shard_and_never_a_double_grant() {
    killed_master::<false>(Coverage::Partial, Migration::None).await;
}

/// The same with Redis's default `cluster-require-full-coverage yes`: every shard answers
/// `CLUSTERDOWN` until the promotion, so leases on the other shards are kept only if their
/// validity outlasts that window (node timeout + election), and reported lost otherwise; still
/// no lease is granted twice, 0 overlaps and 0 rejected fenced writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_full_coverage_a_killed_master_stops_every_shard_and_never_double_grants() {
    killed_master::<false>(Coverage::Full, Migration::None).await;
}

/// Over TLS only (`rediss-cluster://`; TLS on the cluster bus and for replication too), under
/// the same load: first a slot of a healthy shard that a section loop locks in moves to another
/// master (the client follows `ASK` and `MOVED` to the new owner's TLS port), then a master is
/// killed. 0 overlaps and 0 rejected fenced writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_moved_slot_and_a_killed_master_never_double_grant() {
    killed_master::<true>(Coverage::Partial, Migration::SectionSlot).await;
}

/// Whether a slot moves under load before the master is killed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Migration {
    None,
    /// The slot of a section loop's key on a healthy shard, to another healthy master.
    SectionSlot,
}

/// `cluster-require-full-coverage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Coverage {
    Full,
    Partial,
}

async fn killed_master<const TLS: bool>(coverage: Coverage, migration: Migration) {
    let ttl = Duration::from_secs(2);
    let configure = |b: distlock::BackendBuilder| b.watchdog_lease(ttl);
    let fx = match coverage {
        Coverage::Full => ClusterOf::<TLS>::start(configure),
        Coverage::Partial => ClusterOf::<TLS>::start_with_nodes(
            &[("cluster-require-full-coverage", "no")],
            configure,
        ),
    };
    let resource = RedisServer::start();
    let victim = fx.owner_of("failed:0").port();
    let keys_where = |prefix: &str, on_victim: bool| -> Vec<String> {
        (0..)
            .map(|i| format!("{prefix}:{i}"))
            .filter(|key| (fx.owner_of(key).port() == victim) == on_victim)
            .take(4)
            .collect()
    };
    let (failed, others) = (keys_where("failed", true), keys_where("other", false));
    let mut failed_guards = Vec::new();
    for key in &failed {
        failed_guards.push(Lock::new(key).on(fx.backend()).acquire().await.unwrap());
    }
    let mut other_guards = Vec::new();
    for key in &others {
        other_guards.push(Lock::new(key).on(fx.backend()).acquire().await.unwrap());
    }
    // Each lease on the failed shard, watched: the task ends when the lease is reported lost.
    let failed_watches: Vec<_> = failed_guards
        .into_iter()
        .map(|guard| {
            tokio::spawn(async move {
                guard.lost().await;
                Instant::now()
            })
        })
        .collect();
    // Tasks looping fenced sections on both kinds of shard, through the failover.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let loops: Vec<_> = keys_where("section", true)
        .into_iter()
        .take(2)
        .chain(keys_where("section", false).into_iter().take(2))
        .map(|key| {
            tokio::spawn(fenced_sections(
                fx.contender(),
                resource.url(),
                key,
                stop.clone(),
            ))
        })
        .collect();
    // Contenders for the leases held on the failed shard.
    let contender = fx.contender();
    let takers: Vec<_> = failed
        .iter()
        .map(|key| {
            let (contender, key) = (contender.clone(), key.clone());
            tokio::spawn(async move {
                loop {
                    if let Ok(guard) = Lock::new(&key)
                        .on(&contender)
                        .wait(Duration::from_secs(30))
                        .acquire()
                        .await
                    {
                        return (Instant::now(), guard);
                    }
                }
            })
        })
        .collect();

    let moved = match migration {
        Migration::None => None,
        Migration::SectionSlot => Some(move_a_section_slot(&fx, victim).await),
    };
    let slot = RedisCluster::slot_of(SingleRedis::lock_key(&failed[0]));
    let (fx, (killed, promoted, took)) = tokio::task::spawn_blocking(move || {
        let mut fx = fx;
        let outcome = fx.cluster.kill_master_and_wait_failover(slot);
        (fx, outcome)
    })
    .await
    .unwrap();
    // Three renewal periods after the promotion: the other shards' leases were renewed all
    // along (their validity is shorter than the time since the kill).
    tokio::time::sleep(ttl).await;
    let others_held = other_guards.iter().filter(|guard| guard.is_held()).count();
    // The failed shard's leases: each kept, or lost before a contender got it.
    let mut failed_kept = 0;
    let mut failed_lost = 0;
    for (watch, taker) in failed_watches.into_iter().zip(takers) {
        if !watch.is_finished() {
            failed_kept += 1;
            assert!(
                !taker.is_finished(),
                "a kept lease was granted to a contender"
            );
            taker.abort();
            watch.abort();
            continue;
        }
        failed_lost += 1;
        let lost_at = watch.await.unwrap();
        let (taken_at, taken) = tokio::time::timeout(Duration::from_secs(30), taker)
            .await
            .expect("a lost lease's lock was never taken")
            .unwrap();
        assert!(
            lost_at <= taken_at,
            "a contender got the lock {:?} before its holder learned it lost it",
            lost_at - taken_at
        );
        taken.release().await.unwrap();
    }
    // New acquisitions on the promoted master.
    let fresh = keys_where_on(&fx, "fresh", promoted);
    let guard = Lock::new(&fresh).on(fx.backend()).acquire().await.unwrap();
    guard.release().await.unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut total = (0, 0, 0, 0);
    for task in loops {
        let (sections, overlaps, rejected, errors) = task.await.unwrap();
        assert!(sections > 0, "a section loop never got its lock");
        total = (
            total.0 + sections,
            total.1 + overlaps,
            total.2 + rejected,
            total.3 + errors,
        );
    }
    eprintln!(
        "CLUSTER ({coverage:?} coverage, {}; slot moved: {moved:?}) master {killed} killed, \
         {promoted} promoted after \
         {took:?}: other shards' leases held {others_held}/{}, failed shard's leases kept \
         {failed_kept} / lost {failed_lost} (each lost before taken); {} fenced sections, {} \
         overlaps, {} rejected, {} calls ended by errors",
        fx.kind(),
        others.len(),
        total.0,
        total.1,
        total.2,
        total.3
    );
    if coverage == Coverage::Partial {
        assert_eq!(
            others_held,
            others.len(),
            "a lease on a healthy shard was lost"
        );
    }
    assert_eq!(
        (total.1, total.2),
        (0, 0),
        "overlapping sections or stale writes"
    );
    for guard in other_guards {
        let held = guard.is_held();
        let released = guard.release().await;
        if held {
            released.unwrap();
        }
    }
}

/// A slot migrated (`CLUSTER SETSLOT … IMPORTING/MIGRATING`, `MIGRATE`, `SETSLOT … NODE`)
/// while a watchdog lease in it is held: the lease is renewed on the new owner (found by the
/// `MOVED` the old one answers, and a new slot map), stays held, and is busy to a contender; a
/// waiter subscribed on the old owner follows the channel to the new one and is woken by the
/// release there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_slot_migrates_is_renewed_on_the_new_owner() {
    let ttl = Duration::from_millis(900);
    let fx = Cluster::start(|b| b.watchdog_lease(ttl));
    let moving = "moving:0".to_owned();
    let source = fx.owner_of(&moving).port();
    // Another lease on the same master, in a slot that stays: the pipeline to that master
    // carries both until the move.
    let staying = keys_where_on(&fx, "staying", source);
    let guard = Lock::new(&moving).on(fx.backend()).acquire().await.unwrap();
    let other = Lock::new(&staying)
        .on(fx.backend())
        .acquire()
        .await
        .unwrap();
    let target = fx
        .cluster
        .masters()
        .iter()
        .map(|master| master.port())
        .find(|&port| port != source)
        .unwrap();
    let slot = RedisCluster::slot_of(SingleRedis::lock_key(&moving));
    // A waiter that relies on notifications alone (a missed one shows as a 30 s wait),
    // subscribed on the old owner.
    let waiters = fx.contender();
    raw::set_backoff_floor(&waiters, Duration::from_secs(30));
    let waiter = common::spawn_waiter(&waiters, &moving, Duration::from_secs(60));
    until_shard_subscribers(fx.cluster.node(source), &moving, 1).await;
    let trips_before = raw::renewal_round_trips(fx.backend());
    tokio::task::block_in_place(|| fx.cluster.migrate_slot(slot, target));
    // Three renewal periods on the new owner.
    tokio::time::sleep(ttl).await;
    let lock = SingleRedis::lock_key(&moving);
    let on_target = common::held_pttl(fx.cluster.node(target), &lock);
    let on_source = fx.cluster.node(source).command(&["EXISTS", &lock]);
    let probe = Lock::new(&moving).on(&fx.contender()).acquire().await;
    // The waiter follows the channel: subscribed on the new owner.
    until_shard_subscribers(fx.cluster.node(target), &moving, 1).await;
    let trips = raw::renewal_round_trips(fx.backend()) - trips_before;
    eprintln!(
        "CLUSTER slot {slot} migrated {source} -> {target} under a {ttl:?} lease: held {}, TTL on \
         the new owner {on_target:?}, {trips} renewal round trips in the 3 periods after",
        guard.is_held()
    );
    assert!(guard.is_held(), "{:?}", guard.check());
    assert!(other.is_held(), "{:?}", other.check());
    let left = on_target.expect("the lock is held on the new owner");
    // Renewed there: a lease not renewed since the move would have run out.
    assert!(left > Duration::ZERO && left <= ttl, "{left:?}");
    assert!(
        matches!(&on_source, Reply::Error(moved) if moved.starts_with("MOVED")),
        "the old owner sends it on: {on_source:?}"
    );
    assert!(matches!(probe, Err(LockError::Busy { .. })), "{probe:?}");
    let released = Instant::now();
    guard.release().await.unwrap();
    let acquired = tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was not woken by the release on the new owner")
        .unwrap()
        .unwrap();
    eprintln!(
        "CLUSTER the waiter followed the channel to the new owner: woken {:?} after the release",
        acquired - released
    );
    other.release().await.unwrap();
}

/// A least-privilege user with the rules `distlock::redis::cluster_acl_rules` returns, set on
/// every node, can do every lock operation on the cluster — and no node logs a denied command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_least_privilege_cluster_user_can_do_every_operation() {
    let ttl = Duration::from_millis(300);
    let fx = Cluster::start(|b| b);
    let rules = distlock::redis::cluster_acl_rules(PREFIX);
    for node in fx.cluster.nodes() {
        let mut setuser = vec!["ACL", "SETUSER", "locker", "on", ">locker-secret"];
        setuser.extend(rules.split(' '));
        assert_eq!(node.command(&setuser), Reply::Simple("OK".into()));
        node.command(&["ACL", "LOG", "RESET"]);
    }
    let url = fx.cluster.url().replacen(
        "redis-cluster://",
        "redis-cluster://locker:locker-secret@",
        1,
    );
    let build = || {
        distlock::Backend::builder(&url)
            .prefix(PREFIX)
            .watchdog_lease(ttl)
            .build()
            .unwrap()
    };
    let (holder, waiters) = (build(), build());
    raw::set_backoff_floor(&waiters, Duration::from_secs(30));
    let guard = Lock::new("acl").on(&holder).acquire().await.unwrap();
    let waiter = common::spawn_waiter(&waiters, "acl", Duration::from_secs(60));
    until_shard_subscribers(fx.owner_of("acl"), "acl", 1).await;
    // Renewed across three periods.
    tokio::time::sleep(ttl).await;
    assert!(guard.is_held(), "{:?}", guard.check());
    assert_eq!(
        holder.inspect("acl").await.unwrap().unwrap().fencing_token,
        guard.fencing_token()
    );
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("woken by the sharded notification")
        .unwrap()
        .unwrap();
    Lock::keys(["acl-a", "acl-b", "acl-c"])
        .on(&holder)
        .run(async {})
        .await
        .unwrap();
    for node in fx.cluster.nodes() {
        let denied = node.command(&["ACL", "LOG"]);
        assert_eq!(
            denied,
            Reply::Array(Some(Vec::new())),
            "node {} denied: {denied:?}",
            node.port()
        );
    }
}

/// A key (with `prefix`) whose lock lives on the node at `port`.
fn keys_where_on<const TLS: bool>(fx: &ClusterOf<TLS>, prefix: &str, port: u16) -> String {
    (0..)
        .map(|i| format!("{prefix}:{i}"))
        .find(|key| fx.owner_of(key).port() == port)
        .unwrap()
}

/// Moves the slot of the section loop on a healthy shard (`section:<i>`, the first not on
/// `victim`) to another master that is not `victim`, while the loop runs: (slot, from, to).
async fn move_a_section_slot<const TLS: bool>(fx: &ClusterOf<TLS>, victim: u16) -> (u16, u16, u16) {
    let key = (0..)
        .map(|i| format!("section:{i}"))
        .find(|key| fx.owner_of(key).port() != victim)
        .unwrap();
    let from = fx.owner_of(&key).port();
    let to = fx
        .cluster
        .masters()
        .iter()
        .map(|master| master.port())
        .find(|&port| port != from && port != victim)
        .unwrap();
    let slot = RedisCluster::slot_of(SingleRedis::lock_key(&key));
    tokio::task::block_in_place(|| fx.cluster.migrate_slot(slot, to));
    (slot, from, to)
}

/// Fenced critical sections on `key` until `stop`: (sections, overlaps, rejected writes, calls
/// that ended with an error).
async fn fenced_sections(
    backend: distlock::Backend,
    resource_url: String,
    key: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (u64, u64, u64, u64) {
    use redis::AsyncCommands;
    let fenced = distlock::redis::FencedStore::open(&resource_url).unwrap();
    let client = redis::Client::open(resource_url.as_str()).unwrap();
    let mut redis = client.get_multiplexed_async_connection().await.unwrap();
    let (mut sections, mut overlaps, mut rejected, mut errors) = (0, 0, 0, 0);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let outcome = Lock::new(&key)
            .on(&backend)
            .wait(Duration::from_secs(30))
            .run(async {
                let inside: i64 = redis.incr(format!("inside:{key}"), 1).await.unwrap();
                let token = distlock::fencing_token().unwrap();
                let written = fenced
                    .write(&format!("fenced:{key}"), token, b"x")
                    .await
                    .unwrap();
                let _: i64 = redis.decr(format!("inside:{key}"), 1).await.unwrap();
                (
                    inside != 1,
                    written != distlock::redis::FencedWrite::Applied,
                )
            })
            .await;
        match outcome {
            Ok((overlap, stale)) => {
                sections += 1;
                overlaps += u64::from(overlap);
                rejected += u64::from(stale);
            }
            Err(_) => errors += 1,
        }
    }
    (sections, overlaps, rejected, errors)
}

/// Cluster settings that cannot work are refused by `build`, naming themselves.
#[test]
fn cluster_settings_that_cannot_work_are_refused() {
    let refused = |builder: distlock::BackendBuilder| builder.build().unwrap_err().to_string();
    let err = refused(distlock::Backend::cluster(["a:1", "b:1"]).min_replicas(1));
    assert!(
        err.contains("min_replicas is 1 for a Redis Cluster"),
        "{err}"
    );
    let err = refused(distlock::Backend::cluster(["a:1"]).tls_ca_pem(b"x".to_vec()));
    assert!(err.contains("use rediss-cluster://"), "{err}");
    for (url, problem) in [
        ("redis-cluster://a:1/0", "has `/0` after the nodes"),
        ("redis-cluster://:hunter2@a:x", "gives `x` as a port"),
    ] {
        let err = refused(distlock::Backend::builder(url));
        assert!(err.contains(problem), "{url}: {err}");
        assert!(!err.contains("hunter2"), "{err}");
    }
    let err = refused(distlock::Backend::redlock([
        "redis://a:1",
        "redis-cluster://b:1",
        "redis://c:1",
    ]));
    assert!(err.contains("is not a Redis URL"), "{err}");
    distlock::Backend::cluster(["a:7000", "b"]).build().unwrap();
}

/// `slots × per_slot` keys whose lock keys fall in `slots` distinct slots, `per_slot` each.
fn keys_sharing_slots(slots: usize, per_slot: usize) -> Vec<String> {
    let mut by_slot: std::collections::BTreeMap<u16, Vec<String>> = Default::default();
    let mut full = 0;
    for i in 0.. {
        let key = format!("lease:{i}");
        let slot = RedisCluster::slot_of(SingleRedis::lock_key(&key));
        if by_slot.len() == slots && !by_slot.contains_key(&slot) {
            continue;
        }
        let keys = by_slot.entry(slot).or_default();
        if keys.len() < per_slot {
            keys.push(key);
            full += usize::from(keys.len() == per_slot);
            if full == slots {
                break;
            }
        }
    }
    by_slot.into_values().flatten().collect()
}
