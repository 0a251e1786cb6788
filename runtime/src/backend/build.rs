//! [`BackendBuilder::build`]: the settings every deployment shares are checked, then the
//! deployment's engine is made, rejecting the settings that do not apply to it.

use super::builder::{validate_prefix, BackendBuilder};
use super::handle::{Backend, Settings, MIN_LEASE};
use crate::engines::settings::{EngineSettings, Replicas};
use crate::engines::spec::{EngineSpec, Optional};
use crate::error::LockError;
use crate::hooks::SharedHooks;
use crate::operating::label::{check_label, default_label};
use std::time::Duration;

/// The schema of a database engine's tables unless [`BackendBuilder::schema`] says otherwise.
const DEFAULT_SCHEMA: &str = "distlock";

impl BackendBuilder {
    /// Checks every setting and builds the backend. Connections open lazily, on first use.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] for the first setting that is wrong, naming it (`setting`) and
    /// saying what is accepted (`problem`, without passwords):
    /// - the deployment: a URL that is malformed or not a lock backend URL (`memory://` with
    ///   anything after it included), `rediss://` without the `tls` feature, `etcd://` without the
    ///   `etcd` feature, Redlock over fewer than 3 masters or one master twice, or a typed
    ///   constructor's empty list, bad `host:port` or empty `master_name`;
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
        let holder_label = match &self.holder_label {
            Some(label) => check_label(label).map(|()| label.clone())?,
            None => default_label(),
        };
        let replicas = self.replicas()?;
        let spec = self
            .spec
            .clone()
            .map_err(|(setting, problem)| LockError::invalid_config(setting, problem))?;
        self.check_optional(&*spec, replicas)?;
        let hooks = SharedHooks::default();
        let engine = spec.open(&EngineSettings {
            prefix: &self.prefix,
            holder_label: &holder_label,
            marker_ttl: self.marker_ttl,
            timeouts: self.timeouts,
            tls: &self.tls,
            replicas,
            master_timeout: self.master_timeout,
            drift_factor: self.drift_factor,
            watchdog_lease: self.watchdog_lease,
            max_backoff: self.max_backoff,
            hooks: &hooks,
            schema: self.schema.as_deref().unwrap_or(DEFAULT_SCHEMA),
            create_schema: self.create_schema,
            fenced: self.fencing_tokens,
        })?;
        Ok(Backend::assemble(
            engine,
            self.settings(&*spec),
            hooks,
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

    /// The optional settings that are set, each checked against what `spec` takes: a refused
    /// one is an error that names it, its value, and why it does not apply.
    fn check_optional(
        &self,
        spec: &dyn EngineSpec,
        replicas: Option<Replicas>,
    ) -> Result<(), LockError> {
        let refused = |setting: Optional| spec.refuses(setting);
        if let Some(timeout) = self.master_timeout {
            if let Some(why) = refused(Optional::MasterTimeout) {
                return Err(LockError::invalid_config(
                    "master_timeout",
                    format!("is set ({}) but {why}", humantime::format_duration(timeout)),
                ));
            }
        }
        if let Some(replicas) = replicas {
            if let Some(why) = refused(Optional::MinReplicas) {
                return Err(LockError::invalid_config(
                    "min_replicas",
                    format!("is {} for {why}", replicas.count),
                ));
            }
        }
        if self.schema.is_some() || self.create_schema {
            if let Some(why) = refused(Optional::Schema) {
                let setting = match self.schema.is_some() {
                    true => "schema",
                    false => "create_schema",
                };
                return Err(LockError::invalid_config(
                    setting,
                    format!("is set for {why}"),
                ));
            }
        }
        if !self.fencing_tokens {
            if let Some(why) = refused(Optional::Unfenced) {
                return Err(LockError::invalid_config(
                    "fencing_tokens",
                    format!("is false for {why}"),
                ));
            }
        }
        if self.tls.is_set() {
            if let Some(why) = refused(Optional::Tls) {
                return Err(LockError::invalid_config(
                    "tls",
                    format!("certificates are configured for {why}"),
                ));
            }
        }
        Ok(())
    }

    /// The replica acknowledgement settings, checked; `None` when off.
    fn replicas(&self) -> Result<Option<Replicas>, LockError> {
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
        Ok(Some(Replicas {
            count: self.min_replicas,
            timeout,
        }))
    }

    fn settings(&self, spec: &dyn EngineSpec) -> Settings {
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
