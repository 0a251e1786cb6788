//! Configuration from the environment: `DISTLOCK_URL`, `DISTLOCK_WATCHDOG_LEASE`,
//! `DISTLOCK_PREFIX`, `DISTLOCK_HOLDER_LABEL`, replica acknowledgement and TLS files.

use crate::backend::{Backend, BackendBuilder, MIN_LEASE};
use crate::env;
use crate::error::LockError;
use std::time::Duration;

type SetDuration = fn(BackendBuilder, Duration) -> BackendBuilder;

/// The duration settings: variable, the builder's name for it, its setter.
const DURATIONS: [(&str, &str, SetDuration); 7] = [
    (
        env::REPLICA_TIMEOUT,
        "replica_timeout",
        BackendBuilder::replica_timeout,
    ),
    (
        env::RESPONSE_TIMEOUT,
        "response_timeout",
        BackendBuilder::response_timeout,
    ),
    (
        env::CONNECT_TIMEOUT,
        "connect_timeout",
        BackendBuilder::connect_timeout,
    ),
    (
        env::MASTER_TIMEOUT,
        "master_timeout",
        BackendBuilder::master_timeout,
    ),
    (env::MAX_BACKOFF, "max_backoff", BackendBuilder::max_backoff),
    (env::LOCAL_BATCH, "local_batch", BackendBuilder::local_batch),
    (env::MARKER_TTL, "marker_ttl", BackendBuilder::marker_ttl),
];

/// Builds a backend from the environment; `Ok(None)` when `DISTLOCK_URL` is not set.
pub(crate) fn backend_from_env() -> Result<Option<Backend>, LockError> {
    let Some(url) = var(env::URL)? else {
        return Ok(None);
    };
    let mut builder = Backend::builder(url.clone());
    if let Some(lease) = watchdog_lease_from_env()? {
        builder = builder.watchdog_lease(lease);
    }
    if let Some(prefix) = var(env::PREFIX)? {
        crate::backend::builder::validate_prefix(&prefix).map_err(|_| {
            LockError::invalid_config(
                env::PREFIX,
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
    builder = schema_from_env(builder)?;
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
        "url" => env::URL,
        "tls_ca_file" => env::TLS_CA_FILE,
        "tls_client_auth_files" => return format!("{}/{}", env::TLS_CERT_FILE, env::TLS_KEY_FILE),
        "min_replicas" => env::MIN_REPLICAS,
        "holder_label" => env::HOLDER_LABEL,
        "schema" => env::SCHEMA,
        "create_schema" => env::CREATE_SCHEMA,
        "fencing_tokens" => env::FENCING_TOKENS,
        "clock_drift_factor" => env::CLOCK_DRIFT_FACTOR,
        "renew_batch" => env::RENEW_BATCH,
        "max_key_len" => env::MAX_KEY_LEN,
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
    if let Some(text) = var(env::MIN_REPLICAS)? {
        builder = builder.min_replicas(whole(env::MIN_REPLICAS, text, "replicas")?);
    }
    if let Some(text) = var(env::RENEW_BATCH)? {
        builder = builder.renew_batch(whole(env::RENEW_BATCH, text, "leases")? as usize);
    }
    if let Some(text) = var(env::MAX_KEY_LEN)? {
        builder = builder.max_key_len(whole(env::MAX_KEY_LEN, text, "bytes")? as usize);
    }
    if let Some(text) = var(env::CLOCK_DRIFT_FACTOR)? {
        let factor = text.parse::<f64>().map_err(|_| {
            LockError::invalid_config(
                env::CLOCK_DRIFT_FACTOR,
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
    match std::env::var(env::HOLDER_LABEL) {
        Ok(label) => builder = builder.holder_label(label),
        Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(LockError::invalid_config(
                env::HOLDER_LABEL,
                "is not valid UTF-8",
            ))
        }
    }
    if let Some(ca) = var(env::TLS_CA_FILE)? {
        builder = builder.tls_ca_file(ca);
    }
    match (var(env::TLS_CERT_FILE)?, var(env::TLS_KEY_FILE)?) {
        (Some(cert), Some(key)) => builder = builder.tls_client_auth_files(cert, key),
        (None, None) => {}
        (Some(_), None) | (None, Some(_)) => {
            return Err(LockError::invalid_config(
                format!("{} and {}", env::TLS_CERT_FILE, env::TLS_KEY_FILE),
                "must be set together (a client certificate needs its private key)",
            ))
        }
    }
    Ok(builder)
}

/// `DISTLOCK_SCHEMA`, `DISTLOCK_CREATE_SCHEMA` and `DISTLOCK_FENCING_TOKENS`.
fn schema_from_env(mut builder: BackendBuilder) -> Result<BackendBuilder, LockError> {
    if let Some(schema) = var(env::SCHEMA)? {
        builder = builder.schema(schema);
    }
    if let Some(create) = boolean(env::CREATE_SCHEMA)? {
        builder = builder.create_schema(create);
    }
    if let Some(fenced) = boolean(env::FENCING_TOKENS)? {
        builder = builder.fencing_tokens(fenced);
    }
    Ok(builder)
}

/// The variable `name` as `true` (`1`) or `false` (`0`), if set.
fn boolean(name: &str) -> Result<Option<bool>, LockError> {
    let Some(text) = var(name)? else {
        return Ok(None);
    };
    match text.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(Some(true)),
        "false" | "0" => Ok(Some(false)),
        _ => Err(LockError::invalid_config(
            name,
            format!("is `{text}`; it must be `true` or `false`"),
        )),
    }
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

/// [`env::WATCHDOG_LEASE`]. `DISTLOCK_WATCHDOG_TIMEOUT`, the name distlock's design first gave it, is
/// refused rather than read or ignored: one name per setting, and a name that does nothing
/// would fail silently.
fn watchdog_lease_from_env() -> Result<Option<Duration>, LockError> {
    const UNREAD: &str = "DISTLOCK_WATCHDOG_TIMEOUT";
    if var(UNREAD)?.is_some() {
        return Err(LockError::invalid_config(
            UNREAD,
            format!(
                "is not read; the watchdog lease's variable is {}",
                env::WATCHDOG_LEASE
            ),
        ));
    }
    var(env::WATCHDOG_LEASE)?
        .map(|lease| parse_watchdog_lease(env::WATCHDOG_LEASE, &lease))
        .transpose()
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
            parse_watchdog_lease(env::WATCHDOG_LEASE, "1s").unwrap(),
            Duration::from_secs(1)
        );
        assert_eq!(
            parse_watchdog_lease(env::WATCHDOG_LEASE, "100ms").unwrap(),
            Duration::from_millis(100)
        );
        let short = parse_watchdog_lease(env::WATCHDOG_LEASE, "99ms")
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("DISTLOCK_WATCHDOG_LEASE is `99ms`; it must be at least 100ms"),
            "{short}"
        );
        let bad = parse_watchdog_lease(env::WATCHDOG_LEASE, "soon")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("not a duration"), "{bad}");
    }
}
