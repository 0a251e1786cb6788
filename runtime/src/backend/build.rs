//! [`BackendBuilder::build`]: the settings every deployment shares are checked, then the
//! deployment's engine is made, rejecting the settings that do not apply to it.

use super::builder::{validate_prefix, BackendBuilder};
use super::handle::{Backend, Settings, MIN_LEASE};
use super::spec::{redacted_list, EngineSpec};
use crate::engines::engine::Engine;
use crate::engines::in_process::InProcessEngine;
use crate::engines::redis::cluster::{ClusterConfig, ClusterEngine};
use crate::engines::redis::cluster_spec::ClusterSpec;
use crate::engines::redis::node::ReplicaAck;
use crate::engines::redis::redlock::{quorum, RedlockConfig, RedlockEngine};
use crate::engines::redis::single::{RedisConfig, RedisEngine, RedisTarget};
use crate::error::LockError;
use crate::hooks::SharedHooks;
use crate::lock::policy::handover_grant;
use crate::operating::label::{check_label, default_label};
use std::sync::Arc;
use std::time::Duration;

/// What every engine is made with.
struct Common {
    holder_label: String,
    replica_ack: Option<ReplicaAck>,
    hooks: SharedHooks,
}

impl BackendBuilder {
    /// Checks every setting and builds the backend. Connections open lazily, on first use.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for the first setting that is wrong, naming it (`setting`) and
    /// saying what is accepted (`problem`, without passwords):
    /// - the deployment: a URL that is malformed or not a lock backend URL, `rediss://` without the
    ///   `tls` feature, `etcd://` without the `etcd` feature, Redlock over fewer than 3 masters or
    ///   one master twice, or a typed constructor's empty list, bad `host:port` or empty
    ///   `master_name`;
    /// - a value out of range: [`watchdog_lease`](Self::watchdog_lease) under 100 ms, an empty
    ///   [`prefix`](Self::prefix) or one with `{`, `}` or a control character,
    ///   [`max_key_len`](Self::max_key_len) or [`renew_batch`](Self::renew_batch) of 0,
    ///   [`max_backoff`](Self::max_backoff) or [`marker_ttl`](Self::marker_ttl) under 1 ms,
    ///   [`clock_drift_factor`](Self::clock_drift_factor) outside 0–0.5, a
    ///   [`holder_label`](Self::holder_label) over 128 bytes or with a control character,
    ///   [`master_timeout`](Self::master_timeout) or [`replica_timeout`](Self::replica_timeout)
    ///   under 1 ms or not under a third of `watchdog_lease`;
    /// - a setting the deployment does not take: `master_timeout` for anything but Redlock,
    ///   [`min_replicas`](Self::min_replicas) for the in-process backend, a Cluster, Redlock or
    ///   etcd, `replica_timeout` without `min_replicas`, TLS settings for anything but `rediss://`
    ///   servers (Sentinel, Cluster and etcd do not support TLS yet);
    /// - TLS files that could not be read or hold no PEM block, and certificates the TLS library
    ///   refuses.
    pub fn build(self) -> Result<Backend, LockError> {
        self.check_shared()?;
        let common = Common {
            holder_label: match &self.holder_label {
                Some(label) => check_label(label).map(|()| label.clone())?,
                None => default_label(),
            },
            replica_ack: self.replica_ack()?,
            hooks: SharedHooks::default(),
        };
        let spec = self
            .spec
            .clone()
            .map_err(|(setting, problem)| LockError::invalid_config(setting, problem))?;
        self.check_master_timeout(&spec)?;
        let engine: Arc<dyn Engine> = match &spec {
            EngineSpec::InProcess => self.in_process_engine(&common)?,
            EngineSpec::Server { url } => self.redis_engine(RedisTarget::Server(url), &common)?,
            EngineSpec::Sentinel(sentinel) => {
                self.reject_tls(
                    "a redis-sentinel:// URL; TLS to sentinels and the primary they name is not \
                     supported yet. Drop the TLS settings, or point rediss:// at the primary's \
                     stable address",
                )?;
                self.redis_engine(RedisTarget::Sentinel(sentinel), &common)?
            }
            EngineSpec::Cluster(cluster) => self.cluster_engine(cluster, &common)?,
            EngineSpec::Redlock { masters } => self.redlock_engine(masters, &common)?,
            #[cfg(feature = "etcd")]
            EngineSpec::Etcd(etcd) => self.etcd_engine(etcd, &common)?,
        };
        Ok(Backend::assemble(
            engine,
            self.settings(&spec),
            common.hooks,
            spec.deployment(),
        ))
    }

    /// The settings every deployment has.
    fn check_shared(&self) -> Result<(), LockError> {
        if self.watchdog_lease < MIN_LEASE {
            return Err(LockError::invalid_config(
                "watchdog_lease",
                format!(
                    "is {}; it must be at least 100ms so renewal (every third of it) can keep up",
                    humantime::format_duration(self.watchdog_lease)
                ),
            ));
        }
        validate_prefix(&self.prefix)?;
        let refuse_if = |setting: &str, wrong: bool, problem: &str| match wrong {
            true => Err(LockError::invalid_config(setting, problem)),
            false => Ok(()),
        };
        refuse_if(
            "max_key_len",
            self.max_key_len == 0,
            "is 0; it must be at least 1",
        )?;
        refuse_if(
            "renew_batch",
            self.renew_batch == 0,
            "is 0; it must be at least 1",
        )?;
        let under_1ms = |time: Duration| time < Duration::from_millis(1);
        refuse_if(
            "max_backoff",
            under_1ms(self.max_backoff),
            "must be at least 1ms",
        )?;
        refuse_if(
            "marker_ttl",
            under_1ms(self.marker_ttl),
            "must be at least 1ms",
        )?;
        if !(0.0..=0.5).contains(&self.drift_factor) {
            return Err(LockError::invalid_config(
                "clock_drift_factor",
                format!(
                    "is {}; it must be between 0 and 0.5 (0.01 is Redlock's)",
                    self.drift_factor
                ),
            ));
        }
        match &self.tls_error {
            Some((setting, problem)) => Err(LockError::invalid_config(*setting, problem.clone())),
            None => Ok(()),
        }
    }

    /// `master_timeout` is Redlock's alone.
    fn check_master_timeout(&self, spec: &EngineSpec) -> Result<(), LockError> {
        match (spec, self.master_timeout) {
            (EngineSpec::Redlock { .. }, _) | (_, None) => Ok(()),
            (spec, Some(timeout)) => Err(LockError::invalid_config(
                "master_timeout",
                format!(
                    "is set ({}) but `{}` is one deployment, not Redlock; it applies to Redlock, \
                     over three or more comma-separated master URLs",
                    humantime::format_duration(timeout),
                    spec.describe()
                ),
            )),
        }
    }

    /// TLS files set for a deployment that cannot use them: an error that says `why`.
    fn reject_tls(&self, why: &str) -> Result<(), LockError> {
        match self.tls.ca.is_some() || self.tls.client.is_some() {
            true => Err(LockError::invalid_config(
                "tls",
                format!("certificates are configured for {why}"),
            )),
            false => Ok(()),
        }
    }

    /// `min_replicas` set for a deployment that cannot acknowledge: an error that says `why`.
    fn reject_replicas(&self, common: &Common, why: &str) -> Result<(), LockError> {
        match common.replica_ack {
            Some(_) => Err(LockError::invalid_config(
                "min_replicas",
                format!("is {} for {why}", self.min_replicas),
            )),
            None => Ok(()),
        }
    }

    fn in_process_engine(&self, common: &Common) -> Result<Arc<dyn Engine>, LockError> {
        self.reject_tls(
            "the in-process backend (memory://), which has no connection to secure; drop the \
             TLS settings",
        )?;
        self.reject_replicas(
            common,
            "the in-process backend (memory://), which has no replicas; set it to 0",
        )?;
        Ok(Arc::new(InProcessEngine::new(
            &self.prefix,
            self.marker_ttl,
            &common.holder_label,
        )))
    }

    fn redis_engine(
        &self,
        target: RedisTarget<'_>,
        common: &Common,
    ) -> Result<Arc<dyn Engine>, LockError> {
        // A grant or renewal carries its WAIT in the same round trip: its reply may take the
        // replica timeout on top of the response timeout.
        let mut timeouts = self.timeouts;
        if let Some(ack) = common.replica_ack {
            timeouts.response += ack.timeout;
        }
        Ok(Arc::new(RedisEngine::open(RedisConfig {
            target,
            prefix: &self.prefix,
            marker_ttl: self.marker_ttl,
            timeouts,
            tls: &self.tls,
            hooks: common.hooks.clone(),
            replica_ack: common.replica_ack,
            holder_label: &common.holder_label,
            handover_grant: handover_grant(self.max_backoff),
        })?))
    }

    fn cluster_engine(
        &self,
        cluster: &ClusterSpec,
        common: &Common,
    ) -> Result<Arc<dyn Engine>, LockError> {
        self.reject_replicas(
            common,
            "a Redis Cluster; replica acknowledgement is not supported there yet. Set it to 0",
        )?;
        self.reject_tls(
            "a redis-cluster:// URL; TLS to cluster nodes is not supported yet. Drop the TLS \
             settings",
        )?;
        Ok(Arc::new(ClusterEngine::open(ClusterConfig {
            spec: cluster,
            prefix: &self.prefix,
            marker_ttl: self.marker_ttl,
            timeouts: self.timeouts,
            hooks: common.hooks.clone(),
            holder_label: &common.holder_label,
            handover_grant: handover_grant(self.max_backoff),
        })?))
    }

    fn redlock_engine(
        &self,
        masters: &[String],
        common: &Common,
    ) -> Result<Arc<dyn Engine>, LockError> {
        self.reject_replicas(
            common,
            "Redlock; its masters are independent servers, each a vote, and replica \
             acknowledgement applies to one primary with replicas (redis:// or \
             redis-sentinel://). Set it to 0, or use one replicated primary",
        )?;
        let master_timeout = self.master_timeout.unwrap_or(Duration::from_millis(50));
        if master_timeout < Duration::from_millis(1) || master_timeout * 3 >= self.watchdog_lease {
            return Err(LockError::invalid_config(
                "master_timeout",
                format!(
                    "is {}; it must be at least 1ms and less than a third of watchdog_lease ({}), \
                     so that a renewal round fits in its period",
                    humantime::format_duration(master_timeout),
                    humantime::format_duration(self.watchdog_lease)
                ),
            ));
        }
        let engine = RedlockEngine::open(RedlockConfig {
            urls: masters,
            prefix: &self.prefix,
            marker_ttl: self.marker_ttl,
            timeouts: self.timeouts,
            master_timeout,
            drift_factor: self.drift_factor,
            tls: &self.tls,
            hooks: common.hooks.clone(),
            holder_label: &common.holder_label,
            grant_time: handover_grant(self.max_backoff),
        })?;
        if let Some(twice) = engine.duplicate_master() {
            return Err(LockError::invalid_config(
                "url",
                format!(
                    "`{}` names the master {twice} twice; its vote would count twice, and \
                     Redlock would not be a majority of independent masters",
                    redacted_list(masters)
                ),
            ));
        }
        if masters.len().is_multiple_of(2) {
            tracing::warn!(
                target: "distlock::config",
                masters = masters.len(),
                quorum = quorum(masters.len()),
                "Redlock over an even number of masters tolerates no more failures than one \
                 master fewer; use an odd number (3 or 5)"
            );
        }
        Ok(Arc::new(engine))
    }

    #[cfg(feature = "etcd")]
    fn etcd_engine(
        &self,
        spec: &crate::engines::etcd::spec::EtcdSpec,
        common: &Common,
    ) -> Result<Arc<dyn Engine>, LockError> {
        use crate::engines::etcd::{EtcdConfig, EtcdEngine};
        self.reject_replicas(
            common,
            "an etcd cluster, whose writes are committed by a majority of its members before \
             they are answered; set it to 0",
        )?;
        self.reject_tls("an etcd:// URL; TLS to etcd is not supported yet. Drop the TLS settings")?;
        Ok(Arc::new(EtcdEngine::open(EtcdConfig {
            spec,
            prefix: &self.prefix,
            timeouts: self.timeouts,
            holder_label: &common.holder_label,
        })))
    }

    /// The replica acknowledgement settings, checked; `None` when off.
    fn replica_ack(&self) -> Result<Option<ReplicaAck>, LockError> {
        if self.min_replicas == 0 {
            return match self.replica_timeout {
                Some(timeout) => Err(LockError::invalid_config(
                    "replica_timeout",
                    format!(
                        "is set ({}) but min_replicas is 0, so nothing waits for replicas; set \
                         min_replicas too, or drop replica_timeout",
                        humantime::format_duration(timeout)
                    ),
                )),
                None => Ok(None),
            };
        }
        let timeout = self
            .replica_timeout
            .unwrap_or_else(|| Duration::from_millis(200).min(self.watchdog_lease / 4));
        let which = match self.replica_timeout {
            Some(_) => "",
            None => " (the default: 200ms, or a quarter of watchdog_lease)",
        };
        if timeout < Duration::from_millis(1) || timeout * 3 >= self.watchdog_lease {
            return Err(LockError::invalid_config(
                "replica_timeout",
                format!(
                    "is {}{which}; it must be at least 1ms and less than a third of \
                     watchdog_lease ({}), so that an acknowledged renewal fits in its period",
                    humantime::format_duration(timeout),
                    humantime::format_duration(self.watchdog_lease)
                ),
            ));
        }
        Ok(Some(ReplicaAck {
            replicas: self.min_replicas,
            timeout,
            marker_ttl: self.marker_ttl,
        }))
    }

    fn settings(&self, spec: &EngineSpec) -> Settings {
        Settings {
            location: spec.describe(),
            prefix: self.prefix.clone(),
            watchdog_lease: self.watchdog_lease,
            max_key_len: self.max_key_len,
            renew_batch: self.renew_batch,
            local_batch: self.local_batch,
            max_backoff: self.max_backoff,
            drift_factor: self.drift_factor,
        }
    }
}
