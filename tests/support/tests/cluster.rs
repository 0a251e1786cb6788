//! The Redis Cluster harness against real processes: three masters with a
//! replica each, slots computed like the server does, a failover after
//! killing a master, and a slot migration.

use std::time::{Duration, Instant};

use distlock_test_support::{RedisCluster, RedisServer, Reply};

const NODE_TIMEOUT: Duration = Duration::from_millis(1000);

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

fn ports(servers: &[&RedisServer]) -> Vec<u16> {
    servers.iter().map(|server| server.port()).collect()
}

/// The `MOVED` error a node answers for a key of `slot` served by `port`.
fn moved(slot: u16, port: u16) -> Reply {
    Reply::Error(format!("MOVED {slot} 127.0.0.1:{port}"))
}

#[test]
fn slots_route_keys_and_a_killed_master_fails_over_to_its_replica() {
    let started = Instant::now();
    let mut cluster = RedisCluster::start(3, 1, NODE_TIMEOUT);
    eprintln!(
        "cluster start (3 masters, 1 replica each): {:?}",
        started.elapsed()
    );

    assert_eq!(cluster.nodes().len(), 6);
    let masters = ports(&cluster.masters());
    assert_eq!(masters.len(), 3, "{masters:?}");
    let hosts: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| format!("127.0.0.1:{}", node.port()))
        .collect();
    assert_eq!(
        cluster.url(),
        format!("redis-cluster://{}", hosts.join(","))
    );
    let seeds: Vec<String> = hosts.iter().map(|host| format!("redis://{host}")).collect();
    assert_eq!(cluster.seed_urls(), seeds);

    // The harness hashes keys like the server does, hash tags included.
    let asked = &cluster.nodes()[0];
    for key in [
        "foo",
        "bar",
        "",
        "user1000",
        "{user1000}.following",
        "x{user1000}y{z}",
        "{}user1000",
        "{user1000",
        "user1000}{",
        "foo{{bar}}zap",
        "distlock:{orders}:lease",
        "schlüssel",
    ] {
        let server = asked.command(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(
            Some(i64::from(RedisCluster::slot_of(key))),
            server.as_int(),
            "key {key:?}"
        );
    }

    // The owner serves the key; any other master redirects to it.
    let key = "{failover}:k";
    let slot = RedisCluster::slot_of(key);
    let owner = cluster.node_for_slot(slot).port();
    assert!(masters.contains(&owner));
    // Acknowledged by the replica, so it must survive the promotion.
    let replies = cluster
        .node(owner)
        .pipeline(&[&["SET", key, "v"], &["WAIT", "1", "5000"]]);
    assert_eq!(replies, [ok(), Reply::Int(1)]);
    assert_eq!(
        cluster
            .node(owner)
            .command(&["GET", key])
            .as_str()
            .as_deref(),
        Some("v")
    );
    for &other in masters.iter().filter(|&&port| port != owner) {
        assert_eq!(
            cluster.node(other).command(&["GET", key]),
            moved(slot, owner)
        );
    }

    let (killed, promoted, took) = cluster.kill_master_and_wait_failover(slot);
    eprintln!("failover: the cluster was ok again {took:?} after the kill");
    assert_eq!(killed, owner);
    assert_ne!(promoted, killed);
    assert!(!cluster.node(killed).is_running());
    assert_eq!(cluster.node_for_slot(slot).port(), promoted);
    let after = ports(&cluster.masters());
    assert_eq!(after.len(), 3, "{after:?}");
    assert!(after.contains(&promoted) && !after.contains(&killed));
    assert!(
        took < NODE_TIMEOUT + Duration::from_secs(10),
        "failover took {took:?}"
    );
    let role = cluster.node(promoted).command(&["ROLE"]);
    assert_eq!(
        role.as_array().unwrap()[0].as_str().as_deref(),
        Some("master"),
        "{role:?}"
    );
    assert_eq!(
        cluster
            .node(promoted)
            .command(&["GET", key])
            .as_str()
            .as_deref(),
        Some("v")
    );
    for &other in after.iter().filter(|&&port| port != promoted) {
        assert_eq!(
            cluster.node(other).command(&["GET", key]),
            moved(slot, promoted)
        );
    }
    // Every surviving node agrees on the new slot map.
    cluster.check();
}

#[test]
fn a_migrated_slot_takes_its_keys_to_the_new_owner() {
    let cluster = RedisCluster::start(3, 1, NODE_TIMEOUT);
    let keys: Vec<String> = (0..5).map(|n| format!("{{migrated}}:{n}")).collect();
    let slot = RedisCluster::slot_of(&keys[0]);
    let source = cluster.node_for_slot(slot).port();
    for key in &keys {
        assert_eq!(RedisCluster::slot_of(key), slot);
        assert_eq!(
            cluster.node(source).command(&["SET", key, key]),
            ok(),
            "{key}"
        );
    }
    // A key of another slot on the same master stays where it is.
    let stays = (0..)
        .map(|n| format!("stays:{n}"))
        .find(|key| {
            let other = RedisCluster::slot_of(key);
            other != slot && cluster.node_for_slot(other).port() == source
        })
        .unwrap();
    assert_eq!(cluster.node(source).command(&["SET", &stays, "1"]), ok());
    let masters = ports(&cluster.masters());
    let target = *masters.iter().find(|&&port| port != source).unwrap();

    let started = Instant::now();
    assert_eq!(cluster.migrate_slot(slot, target), target);
    eprintln!(
        "migration of slot {slot} ({} keys): {:?}",
        keys.len(),
        started.elapsed()
    );

    assert_eq!(cluster.node_for_slot(slot).port(), target);
    for key in &keys {
        assert_eq!(
            cluster
                .node(target)
                .command(&["GET", key])
                .as_str()
                .as_deref(),
            Some(key.as_str())
        );
        // Every other master redirects, the old owner included.
        for &other in masters.iter().filter(|&&port| port != target) {
            assert_eq!(
                cluster.node(other).command(&["GET", key]),
                moved(slot, target),
                "{key} on port {other}"
            );
        }
    }
    assert_eq!(
        cluster
            .node(source)
            .command(&["GET", &stays])
            .as_str()
            .as_deref(),
        Some("1")
    );
    assert_eq!(
        cluster
            .node(source)
            .command(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        Reply::Int(0)
    );
    // Each key is stored once, on its slot's owner.
    let sizes = cluster.command_on_all_masters(&["DBSIZE"]);
    let total: i64 = sizes.iter().map(|size| size.as_int().unwrap()).sum();
    assert_eq!(total, keys.len() as i64 + 1, "{sizes:?}");
    // Migrating to the owner changes nothing.
    assert_eq!(cluster.migrate_slot(slot, target), target);
}
