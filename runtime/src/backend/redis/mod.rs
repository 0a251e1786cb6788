//! One Redis server (or a primary behind a stable address): the single-instance core.
//!
//! Every operation is one script call sent by SHA. The connection is a redis-rs
//! `ConnectionManager`: multiplexed (every task shares one socket), reconnecting by itself.
//! Release notifications arrive on a second, pub/sub connection ([`pubsub`]).

mod diagnose;
mod pubsub;
mod tls;

pub(crate) use tls::{read_pem, TlsFiles};

use super::{Acquired, Holder, Ownership, Renewal, Store, StoreFailure, StoreResult};
use crate::hooks::SharedHooks;
use crate::key::KeyNames;
use crate::owner::Owner;
use crate::scripts::{LuaScript, ACQUIRE, INSPECT, RELEASE, RENEW};
use crate::wait::ReleaseWatch;
use crate::LockError;
use futures_util::future::BoxFuture;
use pubsub::Subscriber;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{FromRedisValue, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Network timeouts of a Redis backend.
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

pub(crate) struct RedisStore {
    client: redis::Client,
    prefix: String,
    fence_counter_ttl_ms: u64,
    timeouts: Timeouts,
    connection: Mutex<Option<Bound>>,
    subscriber: Arc<Subscriber>,
    /// A release notification was refused (and reported) already.
    publish_refused: AtomicBool,
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

/// Where and how a Redis engine connects.
pub(crate) struct RedisConfig<'a> {
    pub(crate) url: &'a str,
    pub(crate) prefix: &'a str,
    pub(crate) fence_counter_ttl: Duration,
    pub(crate) timeouts: Timeouts,
    pub(crate) tls: &'a TlsFiles,
    pub(crate) hooks: SharedHooks,
}

impl RedisStore {
    pub(crate) fn open(config: RedisConfig<'_>) -> Result<Self, LockError> {
        let client = tls::client(config.url, config.tls)?;
        Ok(RedisStore {
            subscriber: Subscriber::new(
                client.clone(),
                config.timeouts,
                config.prefix,
                config.hooks,
            ),
            client,
            prefix: config.prefix.to_owned(),
            fence_counter_ttl_ms: config.fence_counter_ttl.as_millis().max(1) as u64,
            timeouts: config.timeouts,
            connection: Mutex::new(None),
            publish_refused: AtomicBool::new(false),
        })
    }

    fn manager(&self) -> StoreResult<ConnectionManager> {
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
    ) -> StoreResult<T> {
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

    /// The release script could not announce a release: say so, once per backend, loudly — the
    /// release itself stands.
    fn publish_refused(&self, channel: &str) {
        if self.publish_refused.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            target: "distlock::release",
            channel,
            prefix = %self.prefix,
            "the server refused to publish a release notification (the Redis user may not \
             publish on the channel); releases still happen, but waiters in other processes learn \
             of them only by backoff. Grant the rules distlock::redis_acl_rules(prefix) returns"
        );
    }

    fn failure(&self, err: redis::RedisError) -> StoreFailure {
        diagnose::failure(err, &self.prefix)
    }

    fn names(&self, key: &str) -> KeyNames {
        KeyNames::new(&self.prefix, key)
    }
}

fn unexpected(what: &str, value: impl std::fmt::Debug) -> StoreFailure {
    StoreFailure {
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

impl Store for RedisStore {
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
        ttl: Duration,
    ) -> BoxFuture<'a, StoreResult<Acquired>> {
        Box::pin(async move {
            let names = self.names(key);
            let reply: Vec<i64> = self
                .invoke(
                    &ACQUIRE,
                    &[&names.lock, &names.fence],
                    &[
                        owner.as_bytes(),
                        &millis(ttl),
                        self.fence_counter_ttl_ms.to_string().as_bytes(),
                    ],
                )
                .await?;
            match reply.as_slice() {
                [1, fence] if *fence > 0 => Ok(Acquired::Yes {
                    fence: *fence as u64,
                }),
                [0, pttl] => Ok(Acquired::Busy {
                    ttl: u64::try_from(*pttl).ok().map(Duration::from_millis),
                }),
                other => Err(unexpected("acquire", other)),
            }
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a str,
        owner: &'a Owner,
    ) -> BoxFuture<'a, StoreResult<Ownership>> {
        Box::pin(async move {
            let names = self.names(key);
            let code: i64 = self
                .invoke(
                    &RELEASE,
                    &[&names.lock],
                    &[owner.as_bytes(), names.channel.as_bytes()],
                )
                .await?;
            if code == 2 {
                self.publish_refused(&names.channel);
                return Ok(Ownership::Ours);
            }
            Ok(ownership(code))
        })
    }

    fn renew<'a>(&'a self, batch: &'a [Renewal<'a>]) -> BoxFuture<'a, StoreResult<Vec<Ownership>>> {
        Box::pin(async move {
            let locks: Vec<String> = batch.iter().map(|item| self.names(item.key).lock).collect();
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
        })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<Option<Holder>>> {
        Box::pin(async move {
            let names = self.names(key);
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
        })
    }

    fn watch<'a>(&'a self, key: &'a str) -> BoxFuture<'a, StoreResult<ReleaseWatch>> {
        Box::pin(async move { self.subscriber.watch(&self.names(key).channel).await })
    }

    fn watched_channels(&self) -> usize {
        self.subscriber.watched()
    }

    fn doctor(&self) -> BoxFuture<'_, StoreResult<Vec<crate::Finding>>> {
        Box::pin(async move {
            let mut manager = self.manager()?;
            let config = |setting: &'static str| {
                let mut cmd = redis::cmd("CONFIG");
                cmd.arg("GET").arg(setting);
                let mut manager = manager.clone();
                async move {
                    let pairs: Vec<String> = cmd.query_async(&mut manager).await.ok()?;
                    pairs.get(1).cloned()
                }
            };
            let policy = config("maxmemory-policy").await;
            let appendonly = config("appendonly").await;
            let save = config("save").await;
            let replication: String = redis::cmd("INFO")
                .arg("replication")
                .query_async(&mut manager)
                .await
                .unwrap_or_default();
            Ok(crate::doctor::judge(
                policy.as_deref(),
                appendonly.as_deref(),
                save.as_deref(),
                &replication,
            ))
        })
    }
}
