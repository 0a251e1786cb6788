//! Configuration from the environment: `DISTLOCK_URL`, `DISTLOCK_WATCHDOG_LEASE`,
//! `DISTLOCK_PREFIX`, `DISTLOCK_HOLDER_LABEL`, replica acknowledgement and TLS files.

use crate::backend::{Backend, BackendBuilder, MIN_LEASE};
use crate::error::LockError;
use std::time::Duration;

/// Where the backend lives: `redis://…`, `rediss://…`, `unix://…`, `memory://`,
/// `redis-sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[?db=N]`,
/// `redis-cluster://[user:password@]host:port[,host:port…]`,
/// `etcd://[user:password@]host:2379[,host:2379…]` (feature `etcd`), or three or more
/// comma-separated `redis://`/`rediss://` URLs for Redlock over independent masters.
pub const ENV_URL: &str = "DISTLOCK_URL";
/// TTL of watchdog leases, a duration such as `30s` or `1500ms`; at least 100 ms; default 30 s.
/// See [`BackendBuilder::watchdog_lease`](crate::BackendBuilder::watchdog_lease).
pub const ENV_WATCHDOG_LEASE: &str = "DISTLOCK_WATCHDOG_LEASE";
/// The older name of [`ENV_WATCHDOG_LEASE`], read as well; setting both to different values is an
/// error.
pub const ENV_WATCHDOG_TIMEOUT: &str = "DISTLOCK_WATCHDOG_TIMEOUT";
/// Key namespace; default `distlock`.
pub const ENV_PREFIX: &str = "DISTLOCK_PREFIX";
/// Replicas that must acknowledge each grant and renewal (`WAIT`), a whole number; default 0
/// (off). See [`BackendBuilder::min_replicas`](crate::BackendBuilder::min_replicas).
pub const ENV_MIN_REPLICAS: &str = "DISTLOCK_MIN_REPLICAS";
/// How long a grant or renewal waits for the replicas, a duration such as `200ms`; default
/// 200 ms, or a quarter of the watchdog lease when that is less. See
/// [`BackendBuilder::replica_timeout`](crate::BackendBuilder::replica_timeout).
pub const ENV_REPLICA_TIMEOUT: &str = "DISTLOCK_REPLICA_TIMEOUT";
/// For `rediss://`: a PEM file of the CA certificate(s) to trust instead of the web PKI roots.
pub const ENV_TLS_CA_FILE: &str = "DISTLOCK_TLS_CA_FILE";
/// For `rediss://` servers that verify clients: the client's certificate (PEM); needs
/// [`ENV_TLS_KEY_FILE`] too.
pub const ENV_TLS_CERT_FILE: &str = "DISTLOCK_TLS_CERT_FILE";
/// The private key (PEM) of [`ENV_TLS_CERT_FILE`].
pub const ENV_TLS_KEY_FILE: &str = "DISTLOCK_TLS_KEY_FILE";
/// Who this process is, written with every lock it takes (default `hostname:pid`; empty: none).
/// See [`BackendBuilder::holder_label`](crate::BackendBuilder::holder_label).
pub const ENV_HOLDER_LABEL: &str = "DISTLOCK_HOLDER_LABEL";

/// How long a reply may take before it counts as lost, e.g. `500ms`. See
/// [`BackendBuilder::response_timeout`](crate::BackendBuilder::response_timeout).
pub const ENV_RESPONSE_TIMEOUT: &str = "DISTLOCK_RESPONSE_TIMEOUT";
/// How long one connection attempt may take, e.g. `1s`. See
/// [`BackendBuilder::connect_timeout`](crate::BackendBuilder::connect_timeout).
pub const ENV_CONNECT_TIMEOUT: &str = "DISTLOCK_CONNECT_TIMEOUT";
/// Redlock: how long one master may take, e.g. `50ms`. See
/// [`BackendBuilder::master_timeout`](crate::BackendBuilder::master_timeout).
pub const ENV_MASTER_TIMEOUT: &str = "DISTLOCK_MASTER_TIMEOUT";
/// The longest sleep of a waiter between tries, e.g. `100ms`. See
/// [`BackendBuilder::max_backoff`](crate::BackendBuilder::max_backoff).
pub const ENV_MAX_BACKOFF: &str = "DISTLOCK_MAX_BACKOFF";
/// How long a process passes a busy key among its own tasks, e.g. `1ms`. See
/// [`BackendBuilder::local_batch`](crate::BackendBuilder::local_batch).
pub const ENV_LOCAL_BATCH: &str = "DISTLOCK_LOCAL_BATCH";
/// How long a freed lock's token marker stays, e.g. `1h`. See
/// [`BackendBuilder::marker_ttl`](crate::BackendBuilder::marker_ttl).
pub const ENV_MARKER_TTL: &str = "DISTLOCK_MARKER_TTL";
/// The fraction of a lease taken off for clock drift, e.g. `0.01`. See
/// [`BackendBuilder::clock_drift_factor`](crate::BackendBuilder::clock_drift_factor).
pub const ENV_CLOCK_DRIFT_FACTOR: &str = "DISTLOCK_CLOCK_DRIFT_FACTOR";
/// Most leases renewed by one script call, e.g. `256`. See
/// [`BackendBuilder::renew_batch`](crate::BackendBuilder::renew_batch).
pub const ENV_RENEW_BATCH: &str = "DISTLOCK_RENEW_BATCH";
/// The longest key in bytes, e.g. `512`. See
/// [`BackendBuilder::max_key_len`](crate::BackendBuilder::max_key_len).
pub const ENV_MAX_KEY_LEN: &str = "DISTLOCK_MAX_KEY_LEN";

type SetDuration = fn(BackendBuilder, Duration) -> BackendBuilder;

/// The duration settings: variable, the builder's name for it, its setter.
const DURATIONS: [(&str, &str, SetDuration); 7] = [
    (
        ENV_REPLICA_TIMEOUT,
        "replica_timeout",
        BackendBuilder::replica_timeout,
    ),
    (
        ENV_RESPONSE_TIMEOUT,
        "response_timeout",
        BackendBuilder::response_timeout,
    ),
    (
        ENV_CONNECT_TIMEOUT,
        "connect_timeout",
        BackendBuilder::connect_timeout,
    ),
    (
        ENV_MASTER_TIMEOUT,
        "master_timeout",
        BackendBuilder::master_timeout,
    ),
    (ENV_MAX_BACKOFF, "max_backoff", BackendBuilder::max_backoff),
    (ENV_LOCAL_BATCH, "local_batch", BackendBuilder::local_batch),
    (ENV_MARKER_TTL, "marker_ttl", BackendBuilder::marker_ttl),
];

/// Builds a backend from the environment; `Ok(None)` when `DISTLOCK_URL` is not set.
pub(crate) fn backend_from_env() -> Result<Option<Backend>, LockError> {
    let Some(url) = var(ENV_URL)? else {
        return Ok(None);
    };
    let mut builder = Backend::builder(url.clone());
    if let Some(lease) = watchdog_lease_from_env()? {
        builder = builder.watchdog_lease(lease);
    }
    if let Some(prefix) = var(ENV_PREFIX)? {
        crate::backend::builder::validate_prefix(&prefix).map_err(|_| {
            LockError::invalid_config(
                ENV_PREFIX,
                format!(
                    "is `{}`; it must be non-empty, without `{{`, `}}` or control characters",
                    prefix.escape_debug()
                ),
            )
        })?;
        builder = builder.prefix(prefix);
    }
    builder = numbers_from_env(builder)?;
    for (name, _, set) in DURATIONS {
        if let Some(text) = var(name)? {
            builder = set(builder, parse_duration(name, &text)?);
        }
    }
    builder = label_and_tls_from_env(builder)?;
    builder.build().map(Some).map_err(|err| match err {
        LockError::InvalidConfig { setting, problem } => {
            LockError::invalid_config(variable_of(setting), problem)
        }
        other => other,
    })
}

/// The variable that sets the builder's `setting`, for `build()`'s errors.
fn variable_of(setting: String) -> String {
    let variable = match setting.as_str() {
        "url" => ENV_URL,
        "tls_ca_file" => ENV_TLS_CA_FILE,
        "tls_client_auth_files" => return format!("{ENV_TLS_CERT_FILE}/{ENV_TLS_KEY_FILE}"),
        "min_replicas" => ENV_MIN_REPLICAS,
        "holder_label" => ENV_HOLDER_LABEL,
        "clock_drift_factor" => ENV_CLOCK_DRIFT_FACTOR,
        "renew_batch" => ENV_RENEW_BATCH,
        "max_key_len" => ENV_MAX_KEY_LEN,
        duration => match DURATIONS.iter().find(|(_, name, _)| *name == duration) {
            Some((variable, _, _)) => variable,
            None => return setting,
        },
    };
    variable.to_owned()
}

/// `DISTLOCK_MIN_REPLICAS`, `DISTLOCK_RENEW_BATCH`, `DISTLOCK_MAX_KEY_LEN`,
/// `DISTLOCK_CLOCK_DRIFT_FACTOR`.
fn numbers_from_env(mut builder: BackendBuilder) -> Result<BackendBuilder, LockError> {
    let whole = |name: &str, text: String, what: &str| {
        text.parse::<u32>().map_err(|_| {
            LockError::invalid_config(
                name,
                format!("is `{text}`; it must be a whole number of {what} such as `1`"),
            )
        })
    };
    if let Some(text) = var(ENV_MIN_REPLICAS)? {
        builder = builder.min_replicas(whole(ENV_MIN_REPLICAS, text, "replicas")?);
    }
    if let Some(text) = var(ENV_RENEW_BATCH)? {
        builder = builder.renew_batch(whole(ENV_RENEW_BATCH, text, "leases")? as usize);
    }
    if let Some(text) = var(ENV_MAX_KEY_LEN)? {
        builder = builder.max_key_len(whole(ENV_MAX_KEY_LEN, text, "bytes")? as usize);
    }
    if let Some(text) = var(ENV_CLOCK_DRIFT_FACTOR)? {
        let factor = text.parse::<f64>().map_err(|_| {
            LockError::invalid_config(
                ENV_CLOCK_DRIFT_FACTOR,
                format!("is `{text}`; it must be a fraction such as `0.01`"),
            )
        })?;
        builder = builder.clock_drift_factor(factor);
    }
    Ok(builder)
}

/// `DISTLOCK_HOLDER_LABEL` and the TLS files.
fn label_and_tls_from_env(mut builder: BackendBuilder) -> Result<BackendBuilder, LockError> {
    // Set but empty means "no label", unlike the other variables.
    match std::env::var(ENV_HOLDER_LABEL) {
        Ok(label) => builder = builder.holder_label(label),
        Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(LockError::invalid_config(
                ENV_HOLDER_LABEL,
                "is not valid UTF-8",
            ))
        }
    }
    if let Some(ca) = var(ENV_TLS_CA_FILE)? {
        builder = builder.tls_ca_file(ca);
    }
    match (var(ENV_TLS_CERT_FILE)?, var(ENV_TLS_KEY_FILE)?) {
        (Some(cert), Some(key)) => builder = builder.tls_client_auth_files(cert, key),
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => {
            return Err(LockError::invalid_config(
                format!("{ENV_TLS_CERT_FILE} and {ENV_TLS_KEY_FILE}"),
                "must be set together (a client certificate needs its private key)",
            ))
        }
    }
    Ok(builder)
}

/// A human-written duration from the variable `name`.
fn parse_duration(name: &str, text: &str) -> Result<Duration, LockError> {
    humantime::parse_duration(text).map_err(|err| {
        LockError::invalid_config(
            name,
            format!("is `{text}`, which is not a duration ({err}); write it like `200ms`"),
        )
    })
}

fn var(name: &str) -> Result<Option<String>, LockError> {
    match std::env::var(name) {
        Ok(value) if value.trim().is_empty() => Ok(None),
        Ok(value) => Ok(Some(value.trim().to_owned())),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(LockError::invalid_config(name, "is not valid UTF-8"))
        }
    }
}

/// [`ENV_WATCHDOG_LEASE`], or its older name [`ENV_WATCHDOG_TIMEOUT`]; both set must agree.
fn watchdog_lease_from_env() -> Result<Option<Duration>, LockError> {
    match (var(ENV_WATCHDOG_LEASE)?, var(ENV_WATCHDOG_TIMEOUT)?) {
        (Some(lease), Some(timeout)) if lease != timeout => Err(LockError::invalid_config(
            ENV_WATCHDOG_LEASE,
            format!(
                "is `{lease}` and {ENV_WATCHDOG_TIMEOUT} (its older name) is `{timeout}`; \
                 set one of them"
            ),
        )),
        (Some(lease), _) => parse_watchdog_lease(ENV_WATCHDOG_LEASE, &lease).map(Some),
        (None, Some(timeout)) => parse_watchdog_lease(ENV_WATCHDOG_TIMEOUT, &timeout).map(Some),
        (None, None) => Ok(None),
    }
}

/// The watchdog lease TTL in `text`, read from the variable `name`.
pub(crate) fn parse_watchdog_lease(name: &'static str, text: &str) -> Result<Duration, LockError> {
    let duration = humantime::parse_duration(text).map_err(|err| {
        LockError::invalid_config(
            name,
            format!(
                "is `{text}`, which is not a duration ({err}); write it like `30s` or `1500ms`"
            ),
        )
    })?;
    if duration < MIN_LEASE {
        return Err(LockError::invalid_config(
            name,
            format!("is `{text}`; it must be at least 100ms"),
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchdog_leases() {
        assert_eq!(
            parse_watchdog_lease(ENV_WATCHDOG_TIMEOUT, "1s").unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            parse_watchdog_lease(ENV_WATCHDOG_TIMEOUT, "100ms").unwrap(),
            Duration::from_millis(100)
        );
        let short = parse_watchdog_lease(ENV_WATCHDOG_TIMEOUT, "99ms")
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("DISTLOCK_WATCHDOG_TIMEOUT is `99ms`; it must be at least 100ms"),
            "{short}"
        );
        let bad = parse_watchdog_lease(ENV_WATCHDOG_TIMEOUT, "soon")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not a duration"), "{bad}");
    }
}
