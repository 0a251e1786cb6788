//! Configuration from the environment: `DISTLOCK_URL`, `DISTLOCK_WATCHDOG_LEASE`,
//! `DISTLOCK_PREFIX`, `DISTLOCK_HOLDER_LABEL`, replica acknowledgement and TLS files.

use crate::backend::{Backend, MIN_LEASE};
use crate::error::LockError;
use std::time::Duration;

/// Where the backend lives: `redis://…`, `rediss://…`, `unix://…`, `memory://`,
/// `redis-sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[?db=N]`,
/// `redis-cluster://[user:password@]host:port[,host:port…]`, or three or more comma-separated
/// `redis://`/`rediss://` URLs for Redlock over independent masters.
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
/// 200 ms. See [`BackendBuilder::replica_timeout`](crate::BackendBuilder::replica_timeout).
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
    if let Some(replicas) = var(ENV_MIN_REPLICAS)? {
        let replicas = replicas.parse::<u32>().map_err(|_| {
            LockError::invalid_config(
                ENV_MIN_REPLICAS,
                format!("is `{replicas}`; it must be a whole number of replicas such as `1`"),
            )
        })?;
        builder = builder.min_replicas(replicas);
    }
    if let Some(timeout) = var(ENV_REPLICA_TIMEOUT)? {
        let timeout = humantime::parse_duration(&timeout).map_err(|err| {
            LockError::invalid_config(
                ENV_REPLICA_TIMEOUT,
                format!("is `{timeout}`, which is not a duration ({err}); write it like `200ms`"),
            )
        })?;
        builder = builder.replica_timeout(timeout);
    }
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
    builder.build().map(Some).map_err(|err| match err {
        LockError::InvalidConfig { setting, problem } => {
            let setting = match setting.as_str() {
                "url" => ENV_URL.to_owned(),
                "tls_ca_file" => ENV_TLS_CA_FILE.to_owned(),
                "tls_client_auth_files" => format!("{ENV_TLS_CERT_FILE}/{ENV_TLS_KEY_FILE}"),
                "min_replicas" => ENV_MIN_REPLICAS.to_owned(),
                "replica_timeout" => ENV_REPLICA_TIMEOUT.to_owned(),
                "holder_label" => ENV_HOLDER_LABEL.to_owned(),
                _ => setting,
            };
            LockError::invalid_config(setting, problem)
        }
        other => other,
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
