//! The Redis ACL a lock user needs, as rules for `ACL SETUSER`.

/// ACL rules that let a Redis user do everything this library does with keys under `prefix` —
/// and nothing else: its keys and release channels, the scripts, and the commands those scripts
/// call.
///
/// Redis 7 users start with no pub/sub channels (`resetchannels`): without the `&…` rule a
/// waiter cannot subscribe to release notifications, and the release script's `PUBLISH` fails.
/// `PUBSUB NUMSUB` lets inspect count the processes waiting for a lock (without it they are
/// reported unknown). `ROLE` is how a Sentinel client checks that the server the sentinels
/// name is the primary. Set the user on every server: one server, a Sentinel group's primary
/// and replicas (which a failover promotes), each Redlock master.
///
/// ```
/// let rules = distlock::redis::acl_rules("billing");
/// assert!(rules.starts_with("resetkeys ~billing:* resetchannels &billing:*"));
/// // ACL SETUSER locker on >secret <rules>
/// ```
pub fn acl_rules(prefix: &str) -> String {
    format!(
        "{} {}",
        common_rules(prefix),
        "+publish +pubsub|numsub +role"
    )
}

/// [`acl_rules`] for a Redis Cluster (Redis ≥ 7.0): sharded pub/sub (`SPUBLISH`,
/// `SSUBSCRIBE`, `SUNSUBSCRIBE`) instead of the classic commands, and what the cluster client
/// needs to follow the cluster (`CLUSTER SLOTS`, `ASKING` for a slot being migrated). Set the
/// user on every node.
///
/// ```
/// let rules = distlock::redis::cluster_acl_rules("billing");
/// assert!(rules.contains("+spublish +ssubscribe +sunsubscribe"));
/// ```
pub fn cluster_acl_rules(prefix: &str) -> String {
    format!(
        "{} +spublish +ssubscribe +sunsubscribe +pubsub|shardnumsub +cluster|slots +asking",
        common_rules(prefix)
    )
}

fn common_rules(prefix: &str) -> String {
    format!(
        "resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all \
         +evalsha +eval +subscribe +unsubscribe +ping \
         +get +set +setrange +pexpire +pttl +time +wait +del \
         +exists \
         +zadd +zrem +zscore +zcard +zcount +zrange +zrangebyscore +zremrangebyscore"
    )
}
