//! The Redis deployments: one server (`redis://`, `rediss://`, `unix://`), Sentinel
//! (`redis-sentinel://`), Cluster (`redis-cluster://`) and Redlock (three or more server URLs,
//! comma-separated) — their URL schemes, the settings each refuses, and how each engine opens.

use super::cluster::{ClusterConfig, ClusterEngine};
use super::cluster_spec::ClusterSpec;
use super::node::ReplicaAck;
use super::redlock::{quorum, RedlockConfig, RedlockEngine};
use super::sentinel::SentinelSpec;
use super::single::{RedisConfig, RedisEngine, RedisTarget};
use crate::engines::engine::{Deployment, Engine};
use crate::engines::settings::EngineSettings;
use crate::engines::spec::{
    not_a_database, only_redlock, EngineSpec, Optional, Parser, Registration,
};
use crate::error::LockError;
#[cfg(distlock_test_hooks)]
use crate::hooks::Probe;
use crate::lock::policy::handover_grant;
use crate::util::hosts::scheme_of;
use crate::util::redact::redact_url;
use std::sync::Arc;
use std::time::Duration;

/// One server's URL; several, comma-separated, are Redlock over them.
pub(crate) const SERVER: Registration = Registration {
    schemes: &["redis", "rediss", "unix", "redis+unix"],
    forms: "redis://host:port, rediss://host:port, unix:///path/to/socket",
    parser: Parser::Url(|url| {
        Ok(Arc::new(ServerSpec {
            url: url.to_owned(),
        }))
    }),
    list: Some((
        |masters| Ok(Arc::new(RedlockSpec::new(masters)?)),
        "three or more comma-separated redis:// URLs for Redlock",
    )),
};

/// The primary a Sentinel group names.
pub(crate) const SENTINEL: Registration = Registration::url(
    &["redis-sentinel", "rediss-sentinel"],
    "redis[s]-sentinel://host:port,…/MASTER_NAME",
    |url| Ok(Arc::new(SentinelSpec::parse(url)?)),
);

/// A Redis Cluster, from seed nodes.
pub(crate) const CLUSTER: Registration = Registration::url(
    &["redis-cluster", "rediss-cluster"],
    "redis[s]-cluster://host:port,…",
    |url| Ok(Arc::new(ClusterSpec::parse(url)?)),
);

/// One server, or a primary behind a stable address.
#[derive(Debug)]
pub(crate) struct ServerSpec {
    url: String,
}

/// Redlock over independent masters (at least 3), each a full server URL.
#[derive(Debug)]
pub(crate) struct RedlockSpec {
    masters: Vec<String>,
}

impl RedlockSpec {
    /// Redlock over `masters`: at least 3, each a server URL.
    pub(crate) fn new(masters: Vec<String>) -> Result<RedlockSpec, LockError> {
        let listed = || redacted_list(&masters);
        if masters.len() < 3 {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` lists {} masters; Redlock needs at least 3 independent masters (3 or 5 \
                     are the useful sizes), or give one URL for a single server",
                    listed(),
                    masters.len()
                ),
            ));
        }
        let not_a_server =
            |url: &&String| !scheme_of(url).is_some_and(|scheme| SERVER.schemes.contains(&scheme));
        if let Some(bad) = masters.iter().find(not_a_server) {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` in `{}` is not a Redis URL; every Redlock master is a full redis:// \
                     or rediss:// URL, with its own credentials",
                    redact_url(bad),
                    listed()
                ),
            ));
        }
        Ok(RedlockSpec { masters })
    }
}

/// Redlock's master URLs without their passwords, comma-separated: for messages.
fn redacted_list(masters: &[String]) -> String {
    let urls: Vec<String> = masters.iter().map(|url| redact_url(url)).collect();
    urls.join(",")
}

/// The replica acknowledgement settings as the Redis nodes take them.
fn replica_ack(settings: &EngineSettings<'_>) -> Option<ReplicaAck> {
    settings.replicas.map(|replicas| ReplicaAck {
        replicas: replicas.count,
        timeout: replicas.timeout,
        marker_ttl: settings.marker_ttl,
    })
}

/// The single-instance engine on `target`.
fn open_single(
    target: RedisTarget<'_>,
    settings: &EngineSettings<'_>,
) -> Result<Arc<dyn Engine>, LockError> {
    // A grant or renewal carries its WAIT in the same round trip: its reply may take the
    // replica timeout on top of the response timeout.
    let replica_ack = replica_ack(settings);
    let mut timeouts = settings.timeouts;
    if let Some(ack) = replica_ack {
        timeouts.response += ack.timeout;
    }
    let engine = Arc::new(RedisEngine::open(RedisConfig {
        target,
        prefix: settings.prefix,
        marker_ttl: settings.marker_ttl,
        timeouts,
        tls: settings.tls,
        hooks: settings.hooks.clone(),
        replica_ack,
        holder_label: settings.holder_label,
        fenced: settings.fenced,
        handover_grant: handover_grant(settings.max_backoff),
    })?);
    #[cfg(distlock_test_hooks)]
    {
        let hooks = settings.hooks;
        hooks.show(
            Probe::WatchedChannels,
            &engine,
            RedisEngine::watched_channels,
        );
        hooks.show(Probe::BatchedCalls, &engine, RedisEngine::batched_calls);
        hooks.show(
            Probe::BatchedSubscriptions,
            &engine,
            RedisEngine::batched_subscriptions,
        );
        hooks.show(Probe::SwitchesSeen, &engine, RedisEngine::switches_seen);
    }
    Ok(engine)
}

impl EngineSpec for ServerSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Redis
    }

    fn describe(&self) -> String {
        redact_url(&self.url)
    }

    /// TLS files need a `rediss://` URL, which the client checks when it opens.
    fn refuses(&self, setting: Optional) -> Option<String> {
        match setting {
            Optional::Tls | Optional::MinReplicas | Optional::Unfenced => None,
            Optional::MasterTimeout => Some(only_redlock(self)),
            Optional::Schema => Some(not_a_database(self)),
        }
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        open_single(RedisTarget::Server(&self.url), settings)
    }
}

impl EngineSpec for SentinelSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Sentinel
    }

    fn describe(&self) -> String {
        SentinelSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        match setting {
            Optional::Tls if self.secure => None,
            Optional::Tls => Some(
                "a redis-sentinel:// URL, which is not encrypted; use rediss-sentinel:// to \
                 connect to the sentinels and the servers they name with TLS, or drop the TLS \
                 settings"
                    .into(),
            ),
            Optional::MinReplicas | Optional::Unfenced => None,
            Optional::MasterTimeout => Some(only_redlock(self)),
            Optional::Schema => Some(not_a_database(self)),
        }
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        open_single(RedisTarget::Sentinel(self), settings)
    }
}

impl EngineSpec for ClusterSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Cluster
    }

    fn describe(&self) -> String {
        ClusterSpec::describe(self)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        Some(match setting {
            Optional::Tls if self.secure => return None,
            Optional::Unfenced => return None,
            Optional::Tls => "a redis-cluster:// URL, which is not encrypted; use \
                              rediss-cluster:// to connect to every node with TLS, or drop the \
                              TLS settings"
                .into(),
            Optional::MinReplicas => "a Redis Cluster; replica acknowledgement is not \
                                      supported there yet. Set it to 0"
                .into(),
            Optional::MasterTimeout => only_redlock(self),
            Optional::Schema => not_a_database(self),
        })
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        let spec = ClusterSpec {
            tls: settings.tls.clone(),
            ..self.clone()
        };
        let engine = Arc::new(ClusterEngine::open(ClusterConfig {
            spec: &spec,
            prefix: settings.prefix,
            marker_ttl: settings.marker_ttl,
            timeouts: settings.timeouts,
            hooks: settings.hooks.clone(),
            holder_label: settings.holder_label,
            fenced: settings.fenced,
            handover_grant: handover_grant(settings.max_backoff),
        })?);
        #[cfg(distlock_test_hooks)]
        {
            let hooks = settings.hooks;
            hooks.show(
                Probe::WatchedChannels,
                &engine,
                ClusterEngine::watched_channels,
            );
            hooks.show(
                Probe::RenewalRoundTrips,
                &engine,
                ClusterEngine::renewal_round_trips,
            );
        }
        Ok(engine)
    }
}

impl EngineSpec for RedlockSpec {
    fn deployment(&self) -> Deployment {
        Deployment::Redlock
    }

    fn describe(&self) -> String {
        redacted_list(&self.masters)
    }

    fn refuses(&self, setting: Optional) -> Option<String> {
        match setting {
            Optional::Tls | Optional::MasterTimeout => None,
            Optional::Schema => Some(not_a_database(self)),
            Optional::Unfenced => Some(
                "Redlock, whose masters vote on one token per grant and write it back where \
                 they disagree; efficiency locks are for one Redis, Sentinel or Cluster. Drop it"
                    .into(),
            ),
            Optional::MinReplicas => Some(
                "Redlock; its masters are independent servers, each a vote, and replica \
                 acknowledgement applies to one primary with replicas (redis:// or \
                 redis-sentinel://). Set it to 0, or use one replicated primary"
                    .into(),
            ),
        }
    }

    fn open(&self, settings: &EngineSettings<'_>) -> Result<Arc<dyn Engine>, LockError> {
        let master_timeout = settings.master_timeout.unwrap_or(Duration::from_millis(50));
        if master_timeout < Duration::from_millis(1)
            || master_timeout * 3 >= settings.watchdog_lease
        {
            return Err(LockError::invalid_config(
                "master_timeout",
                format!(
                    "is {}; it must be at least 1ms and less than a third of watchdog_lease ({}), \
                     so that a renewal round fits in its period",
                    humantime::format_duration(master_timeout),
                    humantime::format_duration(settings.watchdog_lease)
                ),
            ));
        }
        let engine = RedlockEngine::open(RedlockConfig {
            urls: &self.masters,
            prefix: settings.prefix,
            marker_ttl: settings.marker_ttl,
            timeouts: settings.timeouts,
            master_timeout,
            drift_factor: settings.drift_factor,
            tls: settings.tls,
            hooks: settings.hooks.clone(),
            holder_label: settings.holder_label,
            grant_time: handover_grant(settings.max_backoff),
        })?;
        if let Some(twice) = engine.duplicate_master() {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` names the master {twice} twice; its vote would count twice, and \
                     Redlock would not be a majority of independent masters",
                    self.describe()
                ),
            ));
        }
        if self.masters.len().is_multiple_of(2) {
            tracing::warn!(
                target: "distlock::config",
                masters = self.masters.len(),
                quorum = quorum(self.masters.len()),
                "Redlock over an even number of masters tolerates no more failures than one \
                 master fewer; use an odd number (3 or 5)"
            );
        }
        let engine = Arc::new(engine);
        #[cfg(distlock_test_hooks)]
        settings.hooks.show(
            Probe::WatchedChannels,
            &engine,
            RedlockEngine::watched_channels,
        );
        Ok(engine)
    }
}
