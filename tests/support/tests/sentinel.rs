//! The Redis Sentinel harness against real processes: a primary, a replica,
//! three sentinels, and a failover after killing the primary.

use std::time::Duration;

use distlock_test_support::{command_at, Reply, SentinelGroup, MASTER_NAME};

fn ok() -> Reply {
    Reply::Simple("OK".into())
}

#[test]
fn killing_the_primary_fails_over_to_the_replica() {
    let mut group = SentinelGroup::start(Duration::from_millis(500));
    let (old, new) = (group.primary().addr(), group.replica().addr());

    let sentinels = group.sentinel_addrs();
    assert_eq!(sentinels.len(), 3);
    let hosts: Vec<String> = sentinels.iter().map(ToString::to_string).collect();
    assert_eq!(
        group.sentinel_url(),
        format!("redis-sentinel://{}/{MASTER_NAME}", hosts.join(","))
    );
    assert_eq!(group.master_addr_by_sentinel(), old);

    // Written before the failover and acknowledged by the replica, so it must
    // survive the promotion.
    let replies = group
        .primary()
        .pipeline(&[&["SET", "before", "1"], &["WAIT", "1", "5000"]]);
    assert_eq!(replies, [ok(), Reply::Int(1)]);

    let took = group.kill_primary_and_wait_failover();
    eprintln!("failover: +switch-master {took:?} after the kill");
    assert!(
        took < Duration::from_secs(15),
        "failover took {took:?}\n{}",
        group.sentinel_logs()
    );

    assert_eq!(group.primary().addr(), new);
    assert_eq!(group.replica().addr(), old);
    assert!(!group.replica().is_running());
    assert_eq!(group.master_addr_by_sentinel(), new);
    // Every sentinel, not just the one asked above, names the new primary.
    for sentinel in sentinels {
        let reply = command_at(
            sentinel,
            &["SENTINEL", "get-master-addr-by-name", MASTER_NAME],
            Duration::from_secs(5),
        )
        .unwrap();
        let port = reply.as_array().unwrap()[1].as_str().unwrap();
        assert_eq!(port, new.port().to_string(), "sentinel {sentinel}");
    }

    let promoted = group.primary();
    let role = promoted.command(&["ROLE"]);
    assert_eq!(
        role.as_array().unwrap()[0].as_str().as_deref(),
        Some("master"),
        "{role:?}"
    );
    assert_eq!(promoted.command(&["SET", "after", "2"]), ok());
    assert_eq!(
        promoted.command(&["GET", "before"]).as_str().as_deref(),
        Some("1")
    );
}

#[test]
fn a_restarted_old_primary_rejoins_and_can_take_over_again() {
    let mut group = SentinelGroup::start(Duration::from_millis(500));
    let (first, second) = (group.primary().addr(), group.replica().addr());
    group.kill_primary_and_wait_failover();

    // It comes back empty and as a master; the sentinels make it a replica.
    group.replica_mut().restart();
    group.replica().wait_for_replica_sync();
    let replies = group
        .primary()
        .pipeline(&[&["SET", "k", "v"], &["WAIT", "1", "5000"]]);
    assert_eq!(replies, [ok(), Reply::Int(1)]);

    let took = group.kill_primary_and_wait_failover();
    assert!(
        took < Duration::from_secs(15),
        "failover took {took:?}\n{}",
        group.sentinel_logs()
    );
    assert_eq!(group.primary().addr(), first);
    assert_eq!(group.replica().addr(), second);
    assert_eq!(group.master_addr_by_sentinel(), first);
    assert_eq!(
        group.primary().command(&["GET", "k"]).as_str().as_deref(),
        Some("v")
    );
}
