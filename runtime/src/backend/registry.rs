//! [`Registry`]: named backends, global, configured once in `main`.

use crate::backend::config::backend_from_env;
use crate::backend::Backend;
use crate::env;
use crate::LockError;
use once_cell::sync::Lazy;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The name annotated functions use when they name no backend.
pub const DEFAULT_BACKEND: &str = "default";

/// Named lock backends. One global registry serves the whole process.
///
/// When `"default"` was not registered in code, it is built at first use from the environment:
///
/// | variable | builder setting |
/// |---|---|
/// | [`DISTLOCK_URL`](crate::env::URL) | the URL ([`Backend::builder`]) |
/// | [`DISTLOCK_WATCHDOG_LEASE`](crate::env::WATCHDOG_LEASE) | [`watchdog_lease`](crate::BackendBuilder::watchdog_lease) |
/// | [`DISTLOCK_PREFIX`](crate::env::PREFIX) | [`prefix`](crate::BackendBuilder::prefix) |
/// | [`DISTLOCK_MIN_REPLICAS`](crate::env::MIN_REPLICAS) | [`min_replicas`](crate::BackendBuilder::min_replicas) |
/// | [`DISTLOCK_REPLICA_TIMEOUT`](crate::env::REPLICA_TIMEOUT) | [`replica_timeout`](crate::BackendBuilder::replica_timeout) |
/// | [`DISTLOCK_RESPONSE_TIMEOUT`](crate::env::RESPONSE_TIMEOUT) | [`response_timeout`](crate::BackendBuilder::response_timeout) |
/// | [`DISTLOCK_CONNECT_TIMEOUT`](crate::env::CONNECT_TIMEOUT) | [`connect_timeout`](crate::BackendBuilder::connect_timeout) |
/// | [`DISTLOCK_MASTER_TIMEOUT`](crate::env::MASTER_TIMEOUT) | [`master_timeout`](crate::BackendBuilder::master_timeout) |
/// | [`DISTLOCK_MAX_BACKOFF`](crate::env::MAX_BACKOFF) | [`max_backoff`](crate::BackendBuilder::max_backoff) |
/// | [`DISTLOCK_LOCAL_BATCH`](crate::env::LOCAL_BATCH) | [`local_batch`](crate::BackendBuilder::local_batch) |
/// | [`DISTLOCK_MARKER_TTL`](crate::env::MARKER_TTL) | [`marker_ttl`](crate::BackendBuilder::marker_ttl) |
/// | [`DISTLOCK_CLOCK_DRIFT_FACTOR`](crate::env::CLOCK_DRIFT_FACTOR) | [`clock_drift_factor`](crate::BackendBuilder::clock_drift_factor) |
/// | [`DISTLOCK_RENEW_BATCH`](crate::env::RENEW_BATCH) | [`renew_batch`](crate::BackendBuilder::renew_batch) |
/// | [`DISTLOCK_MAX_KEY_LEN`](crate::env::MAX_KEY_LEN) | [`max_key_len`](crate::BackendBuilder::max_key_len) |
/// | [`DISTLOCK_HOLDER_LABEL`](crate::env::HOLDER_LABEL) | [`holder_label`](crate::BackendBuilder::holder_label) |
/// | [`DISTLOCK_SCHEMA`](crate::env::SCHEMA) | [`schema`](crate::BackendBuilder::schema) |
/// | [`DISTLOCK_CREATE_SCHEMA`](crate::env::CREATE_SCHEMA) | [`create_schema`](crate::BackendBuilder::create_schema) |
/// | [`DISTLOCK_FENCING_TOKENS`](crate::env::FENCING_TOKENS) | [`fencing_tokens`](crate::BackendBuilder::fencing_tokens) |
/// | [`DISTLOCK_TLS_CA_FILE`](crate::env::TLS_CA_FILE) | [`tls_ca_file`](crate::BackendBuilder::tls_ca_file) |
/// | [`DISTLOCK_TLS_CERT_FILE`](crate::env::TLS_CERT_FILE), [`DISTLOCK_TLS_KEY_FILE`](crate::env::TLS_KEY_FILE) | [`tls_client_auth_files`](crate::BackendBuilder::tls_client_auth_files) |
///
/// A bad value is an error naming the variable. A lock on a name that is neither registered nor
/// configurable is [`LockError::NotConfigured`] — never a silent in-process lock.
///
/// ```
/// use distlock::{Backend, Registry};
///
/// Registry::global().register("doc-example", Backend::in_process()).unwrap();
/// assert_eq!(Registry::global().get("doc-example").unwrap().name(), "doc-example");
/// assert!(Registry::global().get("never-registered").is_err());
/// ```
pub struct Registry {
    backends: RwLock<HashMap<String, Backend>>,
}

static GLOBAL: Lazy<Registry> = Lazy::new(|| Registry {
    backends: RwLock::new(HashMap::new()),
});

impl Registry {
    /// The process-wide registry.
    pub fn global() -> &'static Registry {
        &GLOBAL
    }

    /// Registers `backend` under `name`. A name is configured once: registering it again is an
    /// error, so two parts of a program cannot silently disagree about where a lock lives. A
    /// backend has one name (its errors, stats and metrics carry it): registering it under a
    /// second name is an error too — build another `Backend` for it.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] when `name` is empty, when a backend is registered under `name`
    /// already (including `"default"`, once a lock or [`get`](Self::get) built it from the
    /// environment), and when `backend` is registered under another name. Nothing is registered
    /// then.
    pub fn register(&self, name: impl Into<String>, backend: Backend) -> Result<(), LockError> {
        let name = name.into();
        if name.is_empty() {
            return Err(LockError::invalid_config("backend name", "is empty"));
        }
        let mut backends = self.backends.write().unwrap_or_else(|e| e.into_inner());
        if backends.contains_key(&name) {
            return Err(LockError::invalid_config(
                format!("backend `{name}`"),
                "is already registered; configure each backend once, at start-up",
            ));
        }
        // `set` fails when the backend has a name already; that name is the one to compare (the
        // error only hands back the value that was refused).
        if backend.inner.name.set(Arc::from(name.as_str())).is_err() {
            let existing = backend.inner.name.get().map_or("", |existing| existing);
            if existing != name {
                return Err(LockError::invalid_config(
                    format!("backend `{name}`"),
                    format!("is already registered as `{existing}`; build a separate Backend for each name"),
                ));
            }
        }
        backends.insert(name, backend);
        Ok(())
    }

    /// Every backend registered (or built from the environment), in no particular order.
    pub(crate) fn backends(&self) -> Vec<Backend> {
        let backends = self.backends.read().unwrap_or_else(|e| e.into_inner());
        backends.values().cloned().collect()
    }

    /// The backend registered as `name` (for `"default"`, built from the environment when needed).
    ///
    /// # Errors
    /// - [`LockError::NotConfigured`] when no backend is registered as `name` and, for
    ///   `"default"`, `DISTLOCK_URL` is not set either; the hint says how to configure it.
    /// - [`LockError::InvalidConfig`] when `"default"` is built from the environment and a
    ///   variable is invalid, naming the variable. Nothing is registered then, and the next
    ///   call reads the environment again.
    pub fn get(&self, name: &str) -> Result<Backend, LockError> {
        if let Some(backend) = self
            .backends
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
        {
            return Ok(backend.clone());
        }
        if name != DEFAULT_BACKEND {
            return Err(LockError::NotConfigured {
                backend: name.to_owned(),
                hint: format!(
                    "register it at start-up with distlock::Registry::global().register(\"{name}\", backend)"
                ),
            });
        }
        let mut backends = self.backends.write().unwrap_or_else(|e| e.into_inner());
        if let Some(backend) = backends.get(name) {
            return Ok(backend.clone());
        }
        let Some(backend) = backend_from_env()? else {
            return Err(LockError::NotConfigured {
                backend: name.to_owned(),
                hint: format!(
                    "set {} (e.g. redis://127.0.0.1:6379, or memory:// for the in-process backend) \
                     or register one at start-up with distlock::Registry::global().register(\"default\", backend)",
                    env::URL
                ),
            });
        };
        let _ = backend.inner.name.set(Arc::from(name));
        backends.insert(name.to_owned(), backend.clone());
        Ok(backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry() -> Registry {
        Registry {
            backends: RwLock::new(HashMap::new()),
        }
    }

    #[test]
    fn one_backend_under_two_names_is_refused_naming_both() {
        let registry = registry();
        let backend = Backend::in_process();
        registry.register("orders", backend.clone()).unwrap();
        let err = registry.register("billing", backend.clone()).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("`billing`") && message.contains("`orders`"),
            "{message}"
        );
        assert!(registry.get("billing").is_err(), "nothing registered");
        assert_eq!(registry.get("orders").unwrap().name(), "orders");
    }

    #[test]
    fn a_name_is_registered_once() {
        let registry = registry();
        registry.register("orders", Backend::in_process()).unwrap();
        let err = registry
            .register("orders", Backend::in_process())
            .unwrap_err();
        assert!(err.to_string().contains("already registered"), "{err}");
    }
}
