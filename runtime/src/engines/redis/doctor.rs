//! The doctor's judgement of a Redis server: the facts [`Node`](super::node::Node) collects
//! (`CONFIG GET`, `INFO`, `ACL DRYRUN`) read as findings.

use crate::operating::doctor::{Check, Finding};

/// Replica lag (seconds since the last ack) above which the doctor warns.
pub(crate) const MAX_REPLICA_LAG_SECONDS: i64 = 1;

/// Judges the server facts the Redis backend collected; `min_replicas` is the backend's setting
/// (0: off).
pub(crate) fn judge(
    maxmemory_policy: Option<&str>,
    appendonly: Option<&str>,
    save: Option<&str>,
    replication: &str,
    min_replicas: u32,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    match maxmemory_policy {
        Some("noeviction") => {}
        Some(policy) => findings.push(Finding {
            check: Check::Eviction,
            advice: format!(
                "maxmemory-policy is `{policy}`: under memory pressure Redis may evict a lock key, \
                 and the lock is silently gone; set `maxmemory-policy noeviction` on the lock instance"
            ),
        }),
        None => findings.push(unchecked("maxmemory-policy")),
    }
    match (appendonly, save) {
        (Some("no"), Some("")) => findings.push(Finding {
            check: Check::Persistence,
            advice: "neither AOF nor RDB snapshots are enabled: a restart forgets every lock while \
                     its holders still work (fencing tokens stay increasing); enable `appendonly yes` \
                     or make holders tolerate lock loss on restart"
                .into(),
        }),
        (Some(_), Some(_)) => {}
        _ => findings.push(unchecked("appendonly/save")),
    }
    let mut online = 0u32;
    for line in replication.lines() {
        // slave0:ip=127.0.0.1,port=6380,state=online,offset=123,lag=0
        let Some(fields) = line
            .strip_prefix("slave")
            .and_then(|rest| rest.split_once(':'))
        else {
            continue;
        };
        online += u32::from(fields.1.split(',').any(|field| field == "state=online"));
        let lag = fields
            .1
            .split(',')
            .find_map(|field| field.strip_prefix("lag="))
            .and_then(|lag| lag.trim().parse::<i64>().ok());
        if let Some(lag) = lag.filter(|lag| *lag > MAX_REPLICA_LAG_SECONDS) {
            findings.push(Finding {
                check: Check::ReplicaLag,
                advice: format!(
                    "replica {} last acknowledged {lag}s ago: a failover now would lose recent \
                     locks; fix the replica, and set min_replicas so grants wait for replicas",
                    fields.1.split(',').take(2).collect::<Vec<_>>().join(",")
                ),
            });
        }
    }
    if min_replicas > 0 && online < min_replicas {
        findings.push(Finding {
            check: Check::Replicas,
            advice: format!(
                "min_replicas is {min_replicas} but the primary has {online} replica(s) online: \
                 every acquire fails with ReplicasNotAcknowledged; bring replicas back or lower \
                 min_replicas"
            ),
        });
    } else if min_replicas > 0 && online == min_replicas {
        findings.push(Finding {
            check: Check::Replicas,
            advice: format!(
                "min_replicas is {min_replicas} and exactly {online} replica(s) are online: after \
                 a failover the promoted one has {} left, and acquires fail until another \
                 replica follows it; run min_replicas + 1 replicas",
                online - 1
            ),
        });
    }
    findings
}

/// The oldest Redis the scripts run on (`SET … KEEPTTL`, `redis.pcall` error tables, `PUBSUB
/// SHARDNUMSUB` on a cluster need 7.0; one server needs 6.2).
const OLDEST_REDIS: (u32, u32) = (6, 2);

/// Judges `INFO server`: a server older than distlock supports is a finding; Valkey reports its
/// own version beside the Redis one it is compatible with.
pub(crate) fn judge_version(info: &str) -> Option<Finding> {
    let field = |name: &str| {
        info.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    if field("valkey_version").is_some() {
        return None;
    }
    let version = field("redis_version")?;
    let mut parts = version
        .split('.')
        .map(|part| part.parse::<u32>().unwrap_or(0));
    let found = (parts.next()?, parts.next().unwrap_or(0));
    (found < OLDEST_REDIS).then(|| Finding {
        check: Check::Version,
        advice: format!(
            "the server is Redis {version}; distlock needs Redis {}.{} or later (7.0 for a \
             cluster) and is tested on 7.0 and Valkey 8.1: upgrade the lock server",
            OLDEST_REDIS.0, OLDEST_REDIS.1
        ),
    })
}

/// Judges the `ACL DRYRUN` answers for `user`: each command locks need that the user may not
/// run (on keys and channels under the prefix) is named, with the rules to grant.
pub(crate) fn judge_acl(
    user: &str,
    denied: &[String],
    prefix: &str,
    cluster: bool,
) -> Vec<Finding> {
    if denied.is_empty() {
        return Vec::new();
    }
    let rules = match cluster {
        true => super::acl::cluster_acl_rules(prefix),
        false => super::acl::acl_rules(prefix),
    };
    vec![Finding {
        check: Check::Acl,
        advice: format!(
            "the Redis user `{user}` may not do what locks under `{prefix}` need ({}); grant it \
             `ACL SETUSER {user} {rules}`",
            denied.join("; ")
        ),
    }]
}

/// The ACL could not be checked (the user may not run `what`).
pub(crate) fn acl_unchecked(what: &str) -> Finding {
    Finding {
        check: Check::Unchecked,
        advice: format!(
            "could not check the ACL ({what} denied, or a server older than 7.0); run the \
             doctor with an operator's credentials, or compare the user's rules with \
             distlock::redis::acl_rules"
        ),
    }
}

fn unchecked(setting: &str) -> Finding {
    Finding {
        check: Check::Unchecked,
        advice: format!(
            "could not read `{setting}` (CONFIG GET denied?); check it by hand: locks need \
             `maxmemory-policy noeviction` and, ideally, persistence"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_safe_server_has_no_findings() {
        assert!(judge(
            Some("noeviction"),
            Some("yes"),
            Some(""),
            "role:master\r\nconnected_slaves:0\r\n",
            0
        )
        .is_empty());
    }

    #[test]
    fn each_weakness_is_named() {
        let replication =
            "role:master\r\nslave0:ip=10.0.0.2,port=6380,state=online,offset=9,lag=7\r\n";
        let findings = judge(Some("allkeys-lru"), Some("no"), Some(""), replication, 2);
        let checks: Vec<_> = findings.iter().map(|finding| finding.check).collect();
        assert_eq!(
            checks,
            [
                Check::Eviction,
                Check::Persistence,
                Check::ReplicaLag,
                Check::Replicas
            ]
        );
        assert!(findings[0].advice.contains("`allkeys-lru`"));
        assert!(findings[2].advice.contains("7s ago"));
        assert!(findings[3]
            .advice
            .contains("min_replicas is 2 but the primary has 1 replica(s) online"));
        let exact = judge(Some("noeviction"), Some("yes"), Some(""), replication, 1);
        assert!(
            exact[1].advice.contains("run min_replicas + 1 replicas"),
            "{exact:?}"
        );
        assert_eq!(judge(None, None, None, "", 0)[0].check, Check::Unchecked);
    }

    #[test]
    fn old_servers_and_missing_rights_are_named() {
        let old = judge_version("# Server\r\nredis_version:6.0.16\r\n").unwrap();
        assert!(old.advice.contains("Redis 6.0.16"), "{old}");
        assert!(judge_version("redis_version:7.0.15\r\n").is_none());
        assert!(judge_version("redis_version:7.2.4\r\nvalkey_version:8.1.8\r\n").is_none());
        let acl = judge_acl(
            "locker",
            &["SUBSCRIBE: no channel".into()],
            "billing",
            false,
        );
        assert_eq!(acl[0].check, Check::Acl);
        assert!(
            acl[0]
                .advice
                .contains("ACL SETUSER locker resetkeys ~billing:*"),
            "{acl:?}"
        );
        assert!(judge_acl("locker", &[], "billing", false).is_empty());
    }
}
