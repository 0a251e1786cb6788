//! What an operator asks of one server: who holds a lock (`inspect.lua`), a forced unlock
//! (`unlock.lua`), the lock keys (`SCAN`), and the doctor's checks of settings and ACL rules.

use super::{ms_arg, unexpected, Node};
use crate::engines::engine::{EngineResult, Holder};
use crate::engines::redis::scripts::{ACQUIRE, INSPECT, UNLOCK};
use crate::engines::redis::{diagnose, scan};
use crate::lock::key::KeyNames;
use redis::{FromRedisValue, Value};
use std::time::Duration;

impl Node {
    /// The lock keys (without the prefix) matching `pattern` on this server (not a cluster).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only (`SCAN`): dropping the future changes nothing.
    pub(crate) async fn scan(&self, pattern: &str) -> EngineResult<Vec<String>> {
        let pattern = scan::match_pattern(&self.prefix, pattern);
        let locks = scan::walk(&pattern, |cmd| async move { self.raw_query(&cmd).await })
            .await
            .map_err(|err| self.failure(err))?;
        Ok(locks
            .iter()
            .filter_map(|lock| crate::lock::key::key_of(&self.prefix, lock))
            .map(str::to_owned)
            .collect())
    }

    /// `inspect.lua`: who holds the lock on this server.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only: dropping the future changes nothing.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> EngineResult<Option<Holder>> {
        let reply: Vec<Value> = self
            .invoke(&INSPECT, &[&names.lock], &[self.count_subscribers()])
            .await?;
        holder_from(reply, "inspect")
    }

    /// `unlock.lua`: removes the lock whoever holds it (an operator's forced unlock), leaving
    /// the token marker one above its token; the holder it removed.
    ///
    /// # Cancel safety
    /// Not cancel safe.
    /// As [`invoke`](Self::invoke): dropped after sending, the lock may still be removed and its
    /// waiters woken.
    pub(crate) async fn force_unlock(
        &self,
        names: &KeyNames,
        marker_ttl: Duration,
    ) -> EngineResult<Option<Holder>> {
        let marker_ttl = ms_arg(marker_ttl);
        let args: [&[u8]; 3] = [
            &marker_ttl,
            self.publish.as_bytes(),
            self.count_subscribers(),
        ];
        let reply: Vec<Value> = self.invoke(&UNLOCK, &[&names.lock], &args).await?;
        holder_from(reply, "unlock")
    }

    /// The `PUBSUB` subcommand counting a release channel's subscribers.
    fn count_subscribers(&self) -> &'static [u8] {
        match self.publish {
            "SPUBLISH" => b"SHARDNUMSUB",
            _ => b"NUMSUB",
        }
    }

    /// The server settings the doctor judges: eviction policy, persistence, replication. A
    /// setting the server refuses to show (an ACL without `CONFIG`) is judged unchecked; a server
    /// that cannot be reached is the error.
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only (`CONFIG GET`, `INFO`, `ACL`): dropping the future changes nothing.
    pub(crate) async fn doctor(&self) -> EngineResult<Vec<crate::operating::doctor::Finding>> {
        let mut settings = Vec::new();
        for setting in ["maxmemory-policy", "appendonly", "save"] {
            let mut cmd = redis::cmd("CONFIG");
            cmd.arg("GET").arg(setting);
            let value = match self.raw_query::<Vec<String>>(&cmd).await {
                Ok(pairs) => pairs.get(1).cloned(),
                Err(err) if diagnose::is_permanent(&err) => None,
                Err(err) => return Err(self.failure(err)),
            };
            settings.push(value);
        }
        let mut info = redis::cmd("INFO");
        info.arg("replication");
        let replication: String = self.raw_query(&info).await.unwrap_or_default();
        let mut findings = crate::engines::redis::doctor::judge(
            settings[0].as_deref(),
            settings[1].as_deref(),
            settings[2].as_deref(),
            &replication,
            self.replica_ack.map_or(0, |ack| ack.replicas),
        );
        let mut server = redis::cmd("INFO");
        server.arg("server");
        let server: String = self.raw_query(&server).await.unwrap_or_default();
        findings.extend(crate::engines::redis::doctor::judge_version(&server));
        findings.extend(self.check_acl().await);
        Ok(findings)
    }

    /// What the connection's user may not do of what locks need, asked with `ACL DRYRUN` (Redis
    /// ≥ 7.0, and a right of its own: without it the check is reported unchecked).
    ///
    /// # Cancel safety
    /// Cancel safe.
    /// Read-only (`ACL WHOAMI`, `ACL DRYRUN`): dropping the future changes nothing.
    pub(crate) async fn check_acl(&self) -> Vec<crate::operating::doctor::Finding> {
        let user: String = match self
            .raw_query(&redis::cmd("ACL").arg("WHOAMI").clone())
            .await
        {
            Ok(user) => user,
            Err(_) => return vec![crate::engines::redis::doctor::acl_unchecked("ACL WHOAMI")],
        };
        let lock = crate::lock::key::lock_name(&self.prefix, "doctor-probe");
        let channel = crate::lock::key::channel_of(&lock);
        let (publish, subscribe) = match self.publish {
            "SPUBLISH" => ("SPUBLISH", "SSUBSCRIBE"),
            _ => ("PUBLISH", "SUBSCRIBE"),
        };
        let mut needed: Vec<Vec<&str>> = vec![
            vec!["EVALSHA", ACQUIRE.sha(), "1", &lock],
            vec!["EVAL", "return 0", "1", &lock],
            vec!["GET", &lock],
            vec!["SET", &lock, "v", "PX", "1"],
            vec!["SETRANGE", &lock, "0", "W"],
            vec!["DEL", &lock],
            vec!["ZADD", &lock, "1", "m"],
            vec!["PEXPIRE", &lock, "1"],
            vec!["PTTL", &lock],
            vec!["TIME"],
            vec![publish, &channel, "m"],
            vec![subscribe, &channel],
        ];
        if self.replica_ack.is_some() {
            needed.push(vec!["WAIT", "1", "1"]);
        }
        let mut denied = Vec::new();
        for command in &needed {
            let mut dryrun = redis::cmd("ACL");
            dryrun.arg("DRYRUN").arg(&user).arg(command);
            match self.raw_query::<String>(&dryrun).await {
                Ok(answer) if answer == "OK" => {}
                Ok(answer) => denied.push(format!("{}: {answer}", command[0])),
                Err(_) => return vec![crate::engines::redis::doctor::acl_unchecked("ACL DRYRUN")],
            }
        }
        crate::engines::redis::doctor::judge_acl(
            &user,
            &denied,
            &self.prefix,
            self.publish == "SPUBLISH",
        )
    }
}

/// A holder as `inspect.lua` and `unlock.lua` describe it; an empty reply is a free lock.
fn holder_from(reply: Vec<Value>, script: &'static str) -> EngineResult<Option<Holder>> {
    if reply.is_empty() {
        return Ok(None);
    }
    let field = |index: usize| reply.get(index).cloned().unwrap_or(Value::Nil);
    let parsed = (|| {
        Some(Holder {
            owner: String::from_redis_value(field(0)).ok()?,
            fencing_token: u64::from_redis_value(field(1)).ok()?,
            ttl: Duration::from_millis(i64::from_redis_value(field(2)).ok()?.max(0) as u64),
            label: Some(String::from_redis_value(field(3)).ok()?).filter(|l| !l.is_empty()),
            waited_on: i64::from_redis_value(field(4)).ok()? == 1,
            waiting: u64::try_from(i64::from_redis_value(field(5)).ok()?).ok(),
            shared: match reply.get(6) {
                Some(count) => Some(u64::from_redis_value(count.clone()).ok()?),
                None => None,
            },
        })
    })();
    match parsed {
        Some(holder) => Ok(Some(holder)),
        None => Err(unexpected(script, reply)),
    }
}
