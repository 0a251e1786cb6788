//! The typed constructors of the Redis deployments: [`Backend::sentinel`], [`Backend::cluster`]
//! and [`Backend::redlock`], which build the deployment from its hosts instead of writing a
//! URL to be parsed again.

use super::cluster_spec::{ClusterSpec, NODE_PORT};
use super::deployments::RedlockSpec;
use super::sentinel::{SentinelSpec, SENTINEL_PORT};
use crate::backend::{Backend, BackendBuilder};
use crate::engines::settings::TlsFiles;
use crate::engines::spec::EngineSpec;
use crate::error::LockError;
use crate::util::hosts::{host_list, strings};
use std::sync::Arc;

impl Backend {
    /// A builder for the primary a Sentinel group names as `master_name`, followed across
    /// failovers: the same as [`Backend::builder`] with
    /// `redis-sentinel://host:port,…/master_name` (what `DISTLOCK_URL` takes; use that form for
    /// credentials and a database number).
    ///
    /// ```
    /// use std::time::Duration;
    ///
    /// let backend = distlock::Backend::sentinel(
    ///     ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"],
    ///     "orders",
    /// )
    /// .min_replicas(1)
    /// .replica_timeout(Duration::from_millis(200))
    /// .build()
    /// .expect("three sentinels");
    /// # let _ = backend;
    /// ```
    pub fn sentinel<I, S>(sentinels: I, master_name: &str) -> BackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let spec = sentinel(strings(sentinels), master_name);
        BackendBuilder::new(spec.map(|spec| Arc::new(spec) as Arc<dyn EngineSpec>))
    }

    /// A builder for a Redis Cluster, from seed nodes (one reachable is enough; the others are
    /// found from it): the same as [`Backend::builder`] with `redis-cluster://host:port,…` (what
    /// `DISTLOCK_URL` takes; use that form for credentials).
    ///
    /// ```
    /// let backend = distlock::Backend::cluster(["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"])
    ///     .prefix("billing")
    ///     .build()
    ///     .expect("three seed nodes");
    /// # let _ = backend;
    /// ```
    pub fn cluster<I, S>(nodes: I) -> BackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let spec = cluster(strings(nodes));
        BackendBuilder::new(spec.map(|spec| Arc::new(spec) as Arc<dyn EngineSpec>))
    }

    /// A builder for Redlock over independent Redis masters, each a full `redis://` or
    /// `rediss://` URL with its own credentials: at least 3, an odd number (3 or 5) being the
    /// useful sizes. The same as [`Backend::builder`] with the URLs joined by commas (what
    /// `DISTLOCK_URL` takes).
    ///
    /// ```
    /// let backend = distlock::Backend::redlock([
    ///     "redis://10.0.0.1:6379",
    ///     "redis://10.0.0.2:6379",
    ///     "redis://:secret@10.0.0.3:6379",
    /// ])
    /// .master_timeout(std::time::Duration::from_millis(50))
    /// .build()
    /// .expect("three masters");
    /// # let _ = backend;
    /// ```
    pub fn redlock<I, U>(masters: I) -> BackendBuilder
    where
        I: IntoIterator<Item = U>,
        U: Into<String>,
    {
        let masters = masters.into_iter().map(Into::into).collect();
        BackendBuilder::new(
            RedlockSpec::new(masters).map(|spec| Arc::new(spec) as Arc<dyn EngineSpec>),
        )
    }
}

/// The primary `master_name` names, found by asking `sentinels` (`host[:port]`, port 26379 by
/// default).
fn sentinel(sentinels: Vec<String>, master_name: &str) -> Result<SentinelSpec, LockError> {
    if master_name.is_empty() {
        return Err(LockError::invalid_config(
            "master_name",
            "is empty; give the name the sentinels monitor the primary under",
        ));
    }
    Ok(SentinelSpec {
        sentinels: host_list("sentinels", &sentinels, SENTINEL_PORT)?,
        secure: false,
        master_name: master_name.to_owned(),
        db: 0,
        username: None,
        password: None,
        sentinel_username: None,
        sentinel_password: None,
    })
}

/// A cluster found from `nodes` (`host[:port]`, port 6379 by default).
fn cluster(nodes: Vec<String>) -> Result<ClusterSpec, LockError> {
    Ok(ClusterSpec {
        seeds: host_list("nodes", &nodes, NODE_PORT)?,
        secure: false,
        tls: TlsFiles::default(),
        username: None,
        password: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_constructors_build_the_spec_a_url_would() {
        let typed = sentinel(vec!["10.0.0.1".into(), "[::1]:26380".into()], "orders/eu");
        let url = SentinelSpec::parse("redis-sentinel://10.0.0.1,[::1]:26380/orders%2Feu");
        assert_eq!(typed.unwrap(), url.unwrap());
        let typed = cluster(vec!["a:7000".into(), "b".into()]);
        assert_eq!(
            typed.unwrap(),
            ClusterSpec::parse("redis-cluster://a:7000,b").unwrap()
        );
    }

    #[test]
    fn typed_constructors_name_what_is_wrong() {
        let err = |problem: LockError| problem.to_string();
        assert!(err(sentinel(vec![], "m").unwrap_err()).contains("sentinels is empty"));
        assert!(err(sentinel(vec!["h".into()], "").unwrap_err()).contains("master_name is empty"));
        let credentials = err(cluster(vec!["u:hunter2@h:1".into()]).unwrap_err());
        assert!(
            credentials.contains("credentials go in the URL form"),
            "{credentials}"
        );
        assert!(!credentials.contains("hunter2"), "{credentials}");
        assert!(err(cluster(vec!["h:port".into()]).unwrap_err()).contains("as a port"));
        let two = RedlockSpec::new(vec!["redis://a".into(), "redis://b".into()]);
        let two = two.unwrap_err().to_string();
        assert!(two.contains("needs at least 3"), "{two}");
    }
}
