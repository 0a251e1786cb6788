//! Redis Cluster, on a real cluster started per test (three masters, three replicas, created with
//! `redis-cli --cluster create`): renewal grouped per master, release notifications over sharded
//! pub/sub. Figures are printed as `CLUSTER …` lines on stderr.

mod common;

use common::{Cluster, Fixture, SingleRedis, PREFIX};
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
    let fx = Cluster::start(|b| b.watchdog_timeout(ttl).renew_batch(LEASES));
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
    assert_eq!(publishes, 0, "a classic PUBLISH is broadcast to every node");
    assert!(spublishes >= 20, "every waited-on release was announced");
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

/// Calls of `command` on `server` (`INFO commandstats`; commands run by scripts included).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.command(&["INFO", "commandstats"]).as_str().unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0, |rest| rest.split(',').next().unwrap().parse().unwrap())
}

/// Waits (at most 5 s) until `key`'s channel has `n` sharded subscribers on `server`. The server
/// announces no subscription, so this asks every 5 ms.
async fn until_shard_subscribers(server: &RedisServer, key: &str, n: i64) {
    let channel = format!("{PREFIX}:{{{key}}}:released");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let count = match server.command(&["PUBSUB", "SHARDNUMSUB", &channel]) {
            Reply::Array(Some(items)) => items[1].as_int().unwrap(),
            other => panic!("PUBSUB SHARDNUMSUB: {other:?}"),
        };
        if count == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{channel} has {count} shard subscribers, never {n}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
