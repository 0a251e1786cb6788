//! [`Backend::doctor`](crate::Backend::doctor): settings of the lock server that quietly weaken
//! locks.

use std::fmt;

/// One thing the doctor found.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// Short, stable name: `"eviction"`, `"persistence"`, `"replica-lag"`, `"replicas"` (fewer
    /// online than `min_replicas` needs), `"unchecked"`, and for Redlock `"unreachable"` (a
    /// master that did not answer).
    pub check: &'static str,
    /// What is wrong, why it matters for locks, and what to do.
    pub advice: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.check, self.advice)
    }
}

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
            check: "eviction",
            advice: format!(
                "maxmemory-policy is `{policy}`: under memory pressure Redis may evict a lock key, \
                 and the lock is silently gone; set `maxmemory-policy noeviction` on the lock instance"
            ),
        }),
        None => findings.push(unchecked("maxmemory-policy")),
    }
    match (appendonly, save) {
        (Some("no"), Some("")) => findings.push(Finding {
            check: "persistence",
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
                check: "replica-lag",
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
            check: "replicas",
            advice: format!(
                "min_replicas is {min_replicas} but the primary has {online} replica(s) online: \
                 every acquire fails with ReplicasNotAcknowledged; bring replicas back or lower \
                 min_replicas"
            ),
        });
    } else if min_replicas > 0 && online == min_replicas {
        findings.push(Finding {
            check: "replicas",
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

fn unchecked(setting: &str) -> Finding {
    Finding {
        check: "unchecked",
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
            ["eviction", "persistence", "replica-lag", "replicas"]
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
        assert_eq!(judge(None, None, None, "", 0)[0].check, "unchecked");
    }
}
