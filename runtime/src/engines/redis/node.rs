//! One Redis server as every Redis-based engine talks to it: a lazily opened, self-reconnecting
//! connection, scripts sent by SHA (the source on NOSCRIPT), and the lock scripts as typed calls.
//! The single-server engine is one node; Redlock is several.

use super::diagnose;
use super::tls::{self, TlsFiles};
use crate::engine::{Acquired, Asker, EngineFailure, EngineResult, Holder, Ownership, Renewal};
use crate::error::LockError;
use crate::key::KeyNames;
use crate::owner::Owner;
use crate::scripts::{LuaScript, ACQUIRE, FENCE_WRITEBACK, INSPECT, RELEASE, RENEW};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Network timeouts of a Redis connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    pub(crate) response: Duration,
    pub(crate) connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            response: Duration::from_millis(500),
            connect: Duration::from_secs(1),
        }
    }
}

/// One lock of a batched acquire: its key (already prefixed), owner, lease TTL, and who asks.
#[derive(Debug, Clone)]
pub(crate) struct LockCall {
    pub(crate) lock: String,
    pub(crate) owner: Owner,
    pub(crate) ttl: Duration,
    pub(crate) asker: Asker,
}

/// How long the waiters a release notifies have the lock before anyone else (`release.lua`):
/// enough for a notification and an acquire round trip on a busy machine, short enough that a
/// notified waiter that vanished leaves the lock idle only briefly.
pub(crate) const HANDOFF_WINDOW: Duration = Duration::from_millis(10);

/// What the release script found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReleaseReply {
    Found(Ownership),
    /// Released, but the server refused the notification (the user may not publish).
    ReleasedUnannounced,
}

pub(crate) struct Node {
    client: redis::Client,
    /// The key prefix, for advice in errors (the ACL rules to grant).
    prefix: String,
    timeouts: Timeouts,
    connection: Mutex<Option<Bound>>,
}

/// A connection bound to the tokio runtime that opened it. Its background tasks die with that
/// runtime (a test's runtime, say); `alive` notices, and the next call opens a new one.
struct Bound {
    manager: ConnectionManager,
    alive: Arc<AtomicBool>,
}

struct AliveFlag(Arc<AtomicBool>);

impl Drop for AliveFlag {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Node {
    /// A node for the server at `url` (connected on first use).
    pub(crate) fn open(
        url: &str,
        tls: &TlsFiles,
        timeouts: Timeouts,
        prefix: &str,
    ) -> Result<Node, LockError> {
        Ok(Node {
            client: tls::client(url, tls)?,
            prefix: prefix.to_owned(),
            timeouts,
            connection: Mutex::new(None),
        })
    }

    /// The redis-rs client, for connections of other kinds (pub/sub).
    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    /// `host:port` of the server, for messages.
    pub(crate) fn address(&self) -> String {
        self.client.get_connection_info().addr().to_string()
    }

    fn manager(&self) -> EngineResult<ConnectionManager> {
        let mut slot = self.connection.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bound) = slot.as_ref() {
            if bound.alive.load(Ordering::Acquire) {
                return Ok(bound.manager.clone());
            }
        }
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeouts.response))
            .set_connection_timeout(Some(self.timeouts.connect))
            // Reconnect quickly, but give up soon enough that an unreachable server is an error
            // within a few connect timeouts, not a hang.
            .set_number_of_retries(2)
            .set_min_delay(Duration::from_millis(20))
            .set_max_delay(Duration::from_millis(250));
        let manager = ConnectionManager::new_lazy_with_config(self.client.clone(), config)
            .map_err(|err| self.failure(err))?;
        let alive = Arc::new(AtomicBool::new(true));
        let flag = AliveFlag(alive.clone());
        tokio::spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        *slot = Some(Bound {
            manager: manager.clone(),
            alive,
        });
        Ok(manager)
    }

    /// Runs `script` by SHA; on NOSCRIPT (first use, restarted server) sends its source.
    ///
    /// # Cancel safety
    /// Dropping the future after the command was written does not unsend it: the script may
    /// still run. Callers that must know (acquire, release) keep what is needed to undo or
    /// finish it — see `acquire.rs` and `release.rs`.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        script: &LuaScript,
        keys: &[&str],
        args: &[&[u8]],
    ) -> EngineResult<T> {
        let mut manager = self.manager()?;
        match script.evalsha(keys, args).query_async(&mut manager).await {
            Err(err)
                if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                script
                    .eval(keys, args)
                    .query_async(&mut manager)
                    .await
                    .map_err(|err| self.failure(err))
            }
            other => other.map_err(|err| self.failure(err)),
        }
    }

    fn failure(&self, err: redis::RedisError) -> EngineFailure {
        diagnose::failure(err, &self.prefix)
    }

    /// `acquire.lua` for one lock: take it (or find it busy, and mark it waited on); the token is
    /// this server's, with its clock counted in steps of `clock_step_us` (1 for µs).
    pub(crate) async fn acquire(
        &self,
        names: &KeyNames,
        owner: &Owner,
        ttl: Duration,
        clock_step_us: u32,
        asker: Asker,
    ) -> EngineResult<Acquired> {
        let item = LockCall {
            lock: names.lock.clone(),
            owner: owner.clone(),
            ttl,
            asker,
        };
        let mut answers = self
            .acquire_many(std::slice::from_ref(&item), clock_step_us)
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("acquire", "no answer"))?
    }

    /// `acquire.lua` for a batch of locks (already prefixed): one answer per lock. A lock whose
    /// key holds a value distlock did not write is answered with its own error; the others are
    /// unaffected.
    pub(crate) async fn acquire_many(
        &self,
        items: &[LockCall],
        clock_step_us: u32,
    ) -> EngineResult<Vec<EngineResult<Acquired>>> {
        let keys: Vec<&str> = items.iter().map(|item| item.lock.as_str()).collect();
        let step = clock_step_us.to_string();
        let ttls: Vec<Vec<u8>> = items.iter().map(|item| millis(item.ttl)).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + 3 * items.len());
        args.push(step.as_bytes());
        for (item, ttl) in items.iter().zip(&ttls) {
            args.push(item.owner.as_bytes());
            args.push(ttl);
            args.push(match item.asker {
                Asker::Once => b"0",
                Asker::WillWait => b"1",
                Asker::Waiting => b"2",
            });
        }
        let reply: Vec<i64> = self.invoke(&ACQUIRE, &keys, &args).await?;
        if reply.len() != 2 * items.len() {
            return Err(unexpected("acquire", reply));
        }
        Ok(reply
            .chunks_exact(2)
            .zip(items)
            .map(|(answer, item)| match *answer {
                [1, fence] if fence > 0 => Ok(Acquired::Yes {
                    fence: fence as u64,
                }),
                [0, pttl] => Ok(Acquired::Busy {
                    ttl: u64::try_from(pttl).ok().map(Duration::from_millis),
                    reserved: false,
                }),
                [3, left] => Ok(Acquired::Busy {
                    ttl: u64::try_from(left).ok().map(Duration::from_millis),
                    reserved: true,
                }),
                [-2, _] => Err(EngineFailure {
                    ambiguous: false,
                    source: diagnose::foreign_value(&format!("the key {}", item.lock)).into(),
                }),
                _ => Err(unexpected("acquire", answer)),
            })
            .collect())
    }

    /// `fence_writeback.lua`: record `fence` as the lock's token (and so, after the release, as
    /// the marker the next token must exceed) where `owner` still holds the lock. `true` when it
    /// did.
    pub(crate) async fn write_back_fence(
        &self,
        names: &KeyNames,
        owner: &Owner,
        fence: u64,
    ) -> EngineResult<bool> {
        let done: i64 = self
            .invoke(
                &FENCE_WRITEBACK,
                &[&names.lock],
                &[owner.as_bytes(), fence.to_string().as_bytes()],
            )
            .await?;
        Ok(done == 1)
    }

    /// `release.lua` for one lock: free it if `owner` holds it, leaving its token as a marker for
    /// `fence_counter_ttl`, and announce it if anyone waits.
    pub(crate) async fn release(
        &self,
        names: &KeyNames,
        owner: &Owner,
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<ReleaseReply> {
        let item = (names.lock.clone(), owner.clone());
        let mut answers = self
            .release_many(
                std::slice::from_ref(&item),
                fence_counter_ttl,
                handoff_window,
            )
            .await?;
        answers
            .pop()
            .ok_or_else(|| unexpected("release", "no answer"))
    }

    /// `release.lua` for a batch of `(lock, owner)` (locks already prefixed): one answer each.
    /// A lock that was waited on is left to the waiters it notifies for `handoff_window`.
    pub(crate) async fn release_many(
        &self,
        items: &[(String, Owner)],
        fence_counter_ttl: Duration,
        handoff_window: Duration,
    ) -> EngineResult<Vec<ReleaseReply>> {
        let keys: Vec<&str> = items.iter().map(|(lock, _)| lock.as_str()).collect();
        let marker_ttl = millis(fence_counter_ttl);
        let window = millis(handoff_window);
        let mut args: Vec<&[u8]> = Vec::with_capacity(2 + items.len());
        args.push(&marker_ttl);
        args.push(&window);
        args.extend(items.iter().map(|(_, owner)| owner.as_bytes()));
        let codes: Vec<i64> = self.invoke(&RELEASE, &keys, &args).await?;
        if codes.len() != items.len() {
            return Err(unexpected("release", codes));
        }
        Ok(codes
            .into_iter()
            .map(|code| match code {
                2 => ReleaseReply::ReleasedUnannounced,
                code => ReleaseReply::Found(ownership(code)),
            })
            .collect())
    }

    /// `renew.lua` for a batch whose keys are already prefixed: one answer per lease.
    pub(crate) async fn renew(
        &self,
        locks: &[String],
        batch: &[Renewal<'_>],
    ) -> EngineResult<Vec<Ownership>> {
        let keys: Vec<&str> = locks.iter().map(String::as_str).collect();
        let ttls: Vec<Vec<u8>> = batch.iter().map(|item| millis(item.ttl)).collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * 2);
        for (item, ttl) in batch.iter().zip(&ttls) {
            args.push(item.owner.as_bytes());
            args.push(ttl);
        }
        let codes: Vec<i64> = self.invoke(&RENEW, &keys, &args).await?;
        if codes.len() != batch.len() {
            return Err(unexpected("renew", codes));
        }
        Ok(codes.into_iter().map(ownership).collect())
    }

    /// `inspect.lua`: who holds the lock on this server.
    pub(crate) async fn inspect(&self, names: &KeyNames) -> EngineResult<Option<Holder>> {
        let reply: Vec<Value> = self.invoke(&INSPECT, &[&names.lock], &[]).await?;
        if reply.is_empty() {
            return Ok(None);
        }
        let parsed: Option<(String, u64, i64)> = (|| {
            let owner = String::from_redis_value(reply.first()?.clone()).ok()?;
            let fence = u64::from_redis_value(reply.get(1)?.clone()).ok()?;
            let pttl = i64::from_redis_value(reply.get(2)?.clone()).ok()?;
            Some((owner, fence, pttl))
        })();
        match parsed {
            Some((owner, fencing_token, pttl)) => Ok(Some(Holder {
                owner,
                fencing_token,
                ttl: Duration::from_millis(pttl.max(0) as u64),
            })),
            None => Err(unexpected("inspect", reply)),
        }
    }

    /// The server settings the doctor judges: eviction policy, persistence, replication. A
    /// setting the server refuses to show (an ACL without `CONFIG`) is judged unchecked; a server
    /// that cannot be reached is the error.
    pub(crate) async fn doctor(&self) -> EngineResult<Vec<crate::doctor::Finding>> {
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
        Ok(crate::doctor::judge(
            settings[0].as_deref(),
            settings[1].as_deref(),
            settings[2].as_deref(),
            &replication,
        ))
    }

    async fn raw_query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let mut manager = match self.manager() {
            Ok(manager) => manager,
            Err(failure) => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "no connection",
                    failure.source.to_string(),
                )))
            }
        };
        cmd.query_async(&mut manager).await
    }
}

/// The release script could not announce a release: say so, once per engine, loudly — the
/// release itself stands.
pub(crate) fn report_refused_publish(reported: &AtomicBool, prefix: &str, channel: &str) {
    if reported.swap(true, Ordering::Relaxed) {
        return;
    }
    tracing::warn!(
        target: "distlock::release",
        channel,
        prefix,
        "the server refused to publish a release notification (the Redis user may not \
         publish on the channel); releases still happen, but waiters in other processes learn \
         of them only by backoff. Grant the rules distlock::redis_acl_rules(prefix) returns"
    );
}

fn unexpected(what: &str, value: impl std::fmt::Debug) -> EngineFailure {
    EngineFailure {
        ambiguous: false,
        source: format!("unexpected reply to {what}: {value:?}").into(),
    }
}

fn ownership(code: i64) -> Ownership {
    match code {
        1 => Ownership::Ours,
        -1 => Ownership::Foreign,
        _ => Ownership::Gone,
    }
}

fn millis(duration: Duration) -> Vec<u8> {
    duration.as_millis().max(1).to_string().into_bytes()
}
